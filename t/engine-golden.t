#!/usr/bin/env perl
# build/bin/kvgate-generate on stories260K against the llama2.c reference
# (golden-greedy.json): every greedy continuation exactly, stopping where run.c stops
# (200 positions, or BOS), and the logits at the last prompt position within 1e-4.
# Then the CLI's other paths: text prompts, chunked prefill, sampling reproducibility,
# and clear errors for bad arguments. BUILD=<dir> picks another build directory.
use strict;
use warnings;
use Test::More;
use File::Temp qw(tempfile);
use JSON::PP;

my $build = $ENV{BUILD} || 'build';
my $bin = "$build/bin/kvgate-generate";
my $shared = $ENV{KVGATE_SHARED} || '../shared';
my $dir = "$shared/models/stories260K";
ok(-x $bin, "$bin is built") or BAIL_OUT("build it first: make BUILD=$build engine");

sub slurp { my ($f) = @_; open my $fh, '<:raw', $f or die "$f: $!"; local $/; my $s = <$fh>; $s // '' }

# Runs the CLI; returns (exit status, stdout, stderr).
sub run_cli {
    my (@args) = @_;
    my (undef, $out_name) = tempfile(UNLINK => 1);
    my (undef, $err_name) = tempfile(UNLINK => 1);
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open STDIN, '<', '/dev/null' or die;
        open STDOUT, '>', $out_name or die;
        open STDERR, '>', $err_name or die;
        exec $bin, @args or exit 127;
    }
    waitpid $pid, 0;
    return ($? >> 8, slurp($out_name), slurp($err_name));
}

my @model = ('--model', "$dir/stories260K.bin", '--tokenizer', "$dir/tok512.bin");
my $golden = JSON::PP->new->decode(slurp("$dir/golden-greedy.json"));
my @cases = @{ $golden->{cases} };
ok(@cases >= 5, 'golden file has the five prompts');

for my $i (0 .. $#cases) {
    my $c = $cases[$i];
    my (undef, $lf) = tempfile(UNLINK => 1);
    my ($rc, $out, $err) = run_cli(@model, '--temperature', '0', '--steps', '200', '--ids',
                                   '--prompt-ids', join(' ', @{ $c->{prompt_ids} }),
                                   '--prompt-logits', $lf);
    is($rc, 0, "case $i: exit 0") or diag($err);
    my @got = split ' ', $out;
    is_deeply(\@got, $c->{greedy_ids}, "case $i: greedy ids match the reference ("
              . scalar(@{ $c->{greedy_ids} }) . " tokens)");
    like($err, qr/prompt: ${\ scalar @{ $c->{prompt_ids} }} tokens; prefill: [\d.]+ tok\/s.*decode: [\d.]+ tok\/s/,
         "case $i: stderr reports prompt length and speeds");

    my @logits = split ' ', slurp($lf);
    my $want = $c->{last_prompt_logits};
    is(scalar @logits, scalar @$want, "case $i: " . scalar(@$want) . " logits written");
    my $maxdiff = 0;
    for my $j (0 .. $#$want) {
        my $d = abs(($logits[$j] // 1e9) - $want->[$j]);
        $maxdiff = $d if $d > $maxdiff;
    }
    ok($maxdiff <= 1e-4, sprintf("case $i: last prompt logits within 1e-4 (max diff %.3g)", $maxdiff));

    # The text prompt tokenizes to the same ids (BOS prepended) and prints the
    # reference's continuation text.
    ($rc, $out, $err) = run_cli(@model, '--temperature', '0', '--steps', '200',
                                '--prompt', $c->{prompt});
    is($rc, 0, "case $i: text prompt exit 0") or diag($err);
    my $full = $c->{full_text};
    my $prefix = $c->{prompt};
    ok(index($full, $prefix) == 0, "case $i: full_text starts with the prompt");
    is($out, substr($full, length $prefix) . "\n", "case $i: text continuation matches full_text");
}

# Chunked prefill (1, 3, 7 tokens per step) gives the same continuation.
{
    my $c = $cases[4];
    my @base = (@model, '--temperature', '0', '--steps', '200', '--ids',
                '--prompt-ids', join(' ', @{ $c->{prompt_ids} }));
    for my $chunk (1, 3, 7) {
        my ($rc, $out) = run_cli(@base, '--prefill-chunk', $chunk);
        is_deeply([split ' ', $out], $c->{greedy_ids}, "prefill in chunks of $chunk: same ids");
    }
    my ($rc, $out) = run_cli(@base, '--block-tokens', '5', '--threads', '1');
    is_deeply([split ' ', $out], $c->{greedy_ids}, "blocks of 5 tokens, 1 thread: same ids");
}

# Sampling: same seed, same output; another seed, (almost surely) another output;
# --max-tokens bounds the count; --logprobs gives "id logprob" lines.
{
    my @s = (@model, '--prompt', 'Once upon a time', '--temperature', '1', '--top-p', '0.9',
             '--ids', '--max-tokens', '40');
    my (undef, $a) = run_cli(@s, '--seed', '7');
    my (undef, $b) = run_cli(@s, '--seed', '7');
    my (undef, $d) = run_cli(@s, '--seed', '8');
    is($a, $b, 'same seed: same sample');
    isnt($a, $d, 'another seed: another sample');
    my @ids = split ' ', $a;
    ok(@ids >= 1 && @ids <= 40, 'at most --max-tokens tokens (' . scalar(@ids) . ')');
    my (undef, $lp) = run_cli(@s, '--seed', '7', '--logprobs');
    my @lines = grep { length } split /\n/, $lp;
    is(scalar @lines, scalar @ids, 'one logprob line per token');
    ok((!grep { !/^\d+ -?\d+\.\d+$/ || (split ' ')[1] > 0 } @lines), 'logprob lines are "id logprob<=0"');
    is(join(' ', map { (split ' ')[0] } @lines), join(' ', @ids), 'logprob lines carry the same ids');
    my (undef, $k1) = run_cli(@model, '--prompt-ids', join(' ', @{ $cases[0]{prompt_ids} }),
                              '--temperature', '1', '--top-k', '1', '--seed', '3', '--ids',
                              '--steps', '200');
    is_deeply([split ' ', $k1], $cases[0]{greedy_ids}, 'top-k 1 sampling is greedy');
}

# Errors: usage problems exit 2, runtime problems exit 1, both with a message.
{
    my @bad = (
        [[], qr/--model is required/],
        [['--model', 'x'], qr/exactly one of --prompt/],
        [['--model', 'x', '--prompt', 'a', '--prompt-ids', '1'], qr/exactly one of/],
        [[@model, '--prompt', 'a', '--temperature', '-1'], qr/--temperature/],
        [[@model, '--prompt', 'a', '--top-p', '1.5'], qr/--top-p/],
        [[@model, '--prompt', 'a', '--top-k', 'x'], qr/--top-k/],
        [[@model, '--prompt', 'a', '--max-tokens', '1e3'], qr/--max-tokens/],
        [[@model, '--prompt', 'a', '--threads', '0'], qr/--threads/],
        [[@model, '--prompt', 'a', '--bogus', '1'], qr/unknown option '--bogus'/],
        [[@model, '--prompt'], qr/--prompt needs a value/],
        [[@model, '--prompt', 'a', '--logprobs'], qr/--logprobs goes with --ids/],
        [[@model, 'stray'], qr/unexpected argument 'stray'/],
    );
    for my $b (@bad) {
        my ($rc, undef, $err) = run_cli(@{ $b->[0] });
        is($rc, 2, "usage error exits 2: @{ $b->[0] }");
        like($err, $b->[1], "  message: " . (split /\n/, $err)[0]);
    }
    my @fail = (
        [['--model', '/nonexistent/model.bin', '--prompt', 'a'], qr/nonexistent/],
        [[@model, '--prompt-ids', '1 2 99999'], qr/out of the vocabulary/],
        [[@model, '--prompt-ids', '1 x 2'], qr/not a list of token ids/],
        [[@model, '--prompt-ids', ''], qr/prompt is empty/],
        [[@model, '--backend', 'tpu', '--prompt', 'a'], qr/unknown backend 'tpu'/],
        [['--model', "$dir/stories260K.bin", '--prompt', 'a'], qr/tokenizer/],
        [[@model, '--prompt-file', '/nonexistent/prompt.txt'], qr/cannot read/],
        [[@model, '--prompt-ids', join(' ', (5) x 600)], qr/context length/],
    );
    for my $f (@fail) {
        my ($rc, undef, $err) = run_cli(@{ $f->[0] });
        is($rc, 1, "runtime error exits 1: " . substr("@{ $f->[0] }", 0, 80));
        like($err, $f->[1], "  message: " . (split /\n/, $err)[0]);
    }
}

done_testing();
