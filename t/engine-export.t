#!/usr/bin/env perl
# kvgate-generate's startup line (the model identity) and --export-llama2c: a synthetic
# model exported as a llama2.c checkpoint runs to the same ids as the original, so other
# implementations can be compared on identical weights. BUILD=<dir> picks the build.
use strict;
use warnings;
use Test::More;
use File::Temp qw(tempdir);

my $build = $ENV{BUILD} || 'build';
my $bin = "$build/bin/kvgate-generate";
my $shared = $ENV{KVGATE_SHARED} || '../shared';
ok(-x $bin, "$bin is built") or BAIL_OUT("build it first: make BUILD=$build engine");
my $dir = tempdir(CLEANUP => 1);

sub run_cli {
    my (@args) = @_;
    my $pid = open(my $fh, '-|') // die "fork: $!";
    if (!$pid) {
        open STDERR, '>&', \*STDOUT or die;
        open STDIN, '<', '/dev/null' or die;
        exec $bin, @args or exit 127;
    }
    local $/;
    my $out = <$fh> // '';
    close $fh;
    return ($? >> 8, $out);
}

my ($rc, $out) = run_cli('--model', 'synthetic:260K', '--export-llama2c', "$dir/s.bin");
is($rc, 0, 'export exits 0') or diag($out);
like($out, qr/^model: synthetic:260K \(synthetic, llama, 5 layers, dim 64, 8\/4 heads, vocab 512, ctx 512, F32\) id ([0-9a-f]{64})$/m,
     'startup line names the model and its 64-hex-digit identity');
my ($id_synth) = $out =~ /\) id ([0-9a-f]{64})$/m;
ok(-s "$dir/s.bin", 'checkpoint written');
# Legacy llama2.c layout: 7 int32 header + every weight + 2 * seq_len * head_size/2 freq_cis floats.
my ($dim, $hid, $L, $vocab, $seq, $hs) = (64, 172, 5, 512, 512, 8);
my $kv = 4 * $hs;
my $floats = $vocab * $dim + $L * ($dim + $dim * $dim + 2 * $kv * $dim + $dim * $dim + $dim + 3 * $hid * $dim)
           + $dim + $seq * $hs;
is(-s "$dir/s.bin", 28 + 4 * $floats, 'checkpoint has the llama2.c legacy size');

my @gen = ('--prompt-ids', '1 300 301 302 303', '--ids', '--max-tokens', '12', '--temperature', '0', '--stop', 'none');
my ($rc1, $a) = run_cli('--model', 'synthetic:260K', @gen);
my ($rc2, $b) = run_cli('--model', "$dir/s.bin", '--tokenizer', "$shared/models/stories260K/tok512.bin", @gen);
is($rc1, 0, 'synthetic model runs');
is($rc2, 0, 'exported checkpoint runs');
my ($ids_a) = $a =~ /^([0-9 ]+)$/m;
my ($ids_b) = $b =~ /^([0-9 ]+)$/m;
ok(defined $ids_a && split(' ', $ids_a) == 12, 'twelve ids generated') or diag($a);
is($ids_b, $ids_a, 'the exported checkpoint generates the same ids');
my ($id_exp) = $b =~ /\) id ([0-9a-f]{64})$/m;
isnt($id_exp, $id_synth, 'a different file (other tokenizer) is another model identity');

($rc, $out) = run_cli('--model', 'synthetic:260K', '--export-llama2c', "$dir/no/such/dir/x.bin");
is($rc, 1, 'unwritable export path exits 1');
like($out, qr{\Q$dir\E/no/such/dir/x\.bin}, 'and names the path');

done_testing;
