#!/usr/bin/env perl
# build/bin/kvgate-tokenize from outside: ids for the reference tokenizations and the
# stories260K golden prompts, --decode round trips, and the error paths (bad files,
# invalid UTF-8, bad ids, usage). BUILD=<dir> picks another build directory.
use strict;
use warnings;
use Test::More;
use File::Temp qw(tempfile);
use JSON::PP;

my $build = $ENV{BUILD} || 'build';
my $bin = "$build/bin/kvgate-tokenize";
my $shared = $ENV{KVGATE_SHARED} || '../shared';
ok(-x $bin, "$bin is built") or BAIL_OUT("build it first: make BUILD=$build tools");

my $tok512 = "$shared/models/stories260K/tok512.bin";
my $llama2 = "$shared/tokenizers/llama2/tokenizer.bin";
my $vectors = "$shared/tokenizers/vectors";

sub slurp { my ($f) = @_; open my $fh, '<:raw', $f or die "$f: $!"; local $/; my $s = <$fh>; $s // '' }

sub spew {
    my ($bytes) = @_;
    my ($fh, $name) = tempfile(UNLINK => 1);
    binmode $fh;
    print $fh $bytes;
    close $fh;
    return $name;
}

# Runs the CLI with $input on stdin; returns (exit status, stdout, stderr).
sub run_cli {
    my ($input, @args) = @_;
    my $in_name = spew($input);
    my (undef, $out_name) = tempfile(UNLINK => 1);
    my (undef, $err_name) = tempfile(UNLINK => 1);
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open STDIN, '<', $in_name or die;
        open STDOUT, '>', $out_name or die;
        open STDERR, '>', $err_name or die;
        exec $bin, @args or exit 127;
    }
    waitpid $pid, 0;
    return ($? >> 8, slurp($out_name), slurp($err_name));
}

# ---- golden prompts (BOS + encode) ----
my $golden = JSON::PP->new->decode(slurp("$shared/models/stories260K/golden-greedy.json"));
for my $c (@{ $golden->{cases} }) {
    my $prompt = $c->{prompt};
    utf8::encode($prompt);
    my ($rc, $out, $err) = run_cli($prompt, '--tokenizer', $tok512, '--bos');
    is($rc, 0, "tok512 encodes '$c->{prompt}'") or diag($err);
    is($out, join(' ', @{ $c->{prompt_ids} }) . "\n", "  ids match golden-greedy.json");
}

# ---- reference tokenizations (a sample; the unit tests check them all) ----
for my $vocab ('ggml-vocab-llama-spm.gguf', 'ggml-vocab-gpt-2.gguf') {
    my @inp = split /\n__ggml_vocab_test__\n/, slurp("$vectors/$vocab.inp"), -1;
    pop @inp;                   # after the last separator
    my @out = split /\n/, slurp("$vectors/$vocab.out"), -1;
    is(scalar @inp, 46, "$vocab: 46 test strings");
    for my $i (0, 1, 4, 10, 22, 33, 40) {
        my ($rc, $got, $err) = run_cli($inp[$i], '--tokenizer', "$vectors/$vocab");
        my $want = $out[$i];
        $want =~ s/^\s+//;
        is($got, "$want\n", "$vocab string $i") or diag($err);
    }
}

# ---- --decode round trips ----
my @texts = (
    "Hello world",
    "  leading spaces, trailing spaces  ",
    "line one\nline two\n\n\ttabbed",
    "emoji \xF0\x9F\x98\x80, CJK \xE4\xBD\xA0\xE5\xA5\xBD, combining e\xCC\x81",
    "control \x01\x02\x7f chars",
);
for my $i (0 .. $#texts) {
    my ($rc, $ids, $err) = run_cli($texts[$i], '--tokenizer', $llama2);
    is($rc, 0, "llama2 encodes text $i") or diag($err);
    like($ids, qr/^\d+( \d+)*\n\z/, "  one line of ids");
    my ($rc2, $back, $err2) = run_cli($ids, '--tokenizer', $llama2, '--decode');
    is($rc2, 0, "  decodes") or diag($err2);
    is($back, $texts[$i], "  round trip is exact");
}
{
    my ($rc, $out) = run_cli('', '--tokenizer', $llama2);
    is($out, "\n", 'empty input: an empty line of ids');
    ($rc, $out) = run_cli('', '--tokenizer', $llama2, '--bos');
    is($out, "1\n", 'empty input with --bos: just BOS');
}

# ---- special tokens ----
{
    my $gpt2 = "$vectors/ggml-vocab-gpt-2.gguf";
    my (undef, $plain) = run_cli('<|endoftext|>', '--tokenizer', $gpt2);
    my (undef, $special) = run_cli('<|endoftext|>', '--tokenizer', $gpt2, '--special');
    is($special, "50256\n", '--special turns <|endoftext|> into its id');
    isnt($plain, "50256\n", 'without --special it is plain text');
}

# ---- errors ----
sub fails_like {
    my ($input, $args, $re, $name) = @_;
    my ($rc, $out, $err) = run_cli($input, @$args);
    is($rc, 1, "$name: exit status 1");
    like($err, $re, "$name: message");
}

my $garbage = spew("this is not a tokenizer, just some text that goes on and on\n" x 3);
fails_like('hi', ['--tokenizer', $garbage], qr/\Q$garbage\E: not a tokenizer file/, 'garbage file');
my $truncated_gguf = spew(substr(slurp("$vectors/ggml-vocab-gpt-2.gguf"), 0, 5000));
fails_like('hi', ['--tokenizer', $truncated_gguf], qr/\Q$truncated_gguf\E: .*(truncated|remain)/i,
           'truncated GGUF');
my $truncated_bin = spew(substr(slurp($tok512), 0, 3001));
fails_like('hi', ['--tokenizer', $truncated_bin], qr/\Q$truncated_bin\E: truncated llama2\.c tokenizer/,
           'truncated tokenizer.bin');
my $bad_json = spew('{"model": {"type": "BPE", "vocab": ');
fails_like('hi', ['--tokenizer', $bad_json], qr/\Q$bad_json\E: /, 'truncated tokenizer.json');
my $empty = spew('');
fails_like('hi', ['--tokenizer', $empty], qr/\Q$empty\E: empty file/, 'empty file');
fails_like('hi', ['--tokenizer', '/nonexistent/tok.bin'], qr{/nonexistent/tok\.bin: cannot open},
           'missing file');
fails_like("ok \xC3\x28 bad", ['--tokenizer', $tok512], qr/invalid UTF-8 at byte offset 3/, 'invalid UTF-8');
fails_like("1 2 99999", ['--tokenizer', $tok512, '--decode'], qr/token id 99999 .*out of range/, 'bad id');
fails_like("1 two 3", ['--tokenizer', $tok512, '--decode'], qr/'two' at byte offset 2/, 'non-numeric id');

{
    my ($rc, $out) = run_cli('', '--help');
    is($rc, 0, '--help exits 0');
    like($out, qr/usage: kvgate-tokenize --tokenizer FILE/, '--help prints usage');
    ($rc, undef, my $err) = run_cli('', '--bogus');
    is($rc, 2, 'unknown option: exit status 2');
    like($err, qr/unknown or incomplete option '--bogus'/, 'unknown option: message');
    ($rc, undef, $err) = run_cli('');
    is($rc, 2, 'no --tokenizer: exit status 2');
}

done_testing();
