#!/usr/bin/env perl
# build/bench/kv_int8_ref (t/bench/kv_int8_ref: kvgate's int8 KV beside llama.cpp's q8_0
# KV cache) cannot rot, on the tiny llama file (synth_gguf, F32, head 32), 2 prompts of
# 40 ids, 16 steps, in seconds. What it checks is exact or far from any bound:
#   - llama.cpp (the pinned node-llama-cpp build, Kvgate::LlamaCpp) made each cache asked
#     for: F32 without flash attention, F16 and q8_0 (K and V) with it, and no rotation at
#     head 32, as its own log says (llamacpp_api.h's lc_new_ctx_kv writes type_k, type_v
#     and flash_attn_type at checked offsets and refuses a context whose log disagrees);
#   - the anchor: kvgate's float32 KV and llama.cpp's F32 KV give the same log-probs within
#     2e-5, t/engine-families.t's tolerance for llama (measured 1.3e-6), and the same
#     greedy tokens;
#   - both 8-bit caches are in use: each moves some log-prob by more than 1e-3 (measured
#     0.022 both, over 10,000x the anchor);
#   - kvgate int8 with every layer float32 (--full-layers 2 of 2) is float32: 0 exactly;
#   - kvgate's int8 rows: no value's error over its row's max|x| / 254 (half a step);
#   - two runs print the same bytes (both engines deterministic at the same threads).
# Speed is never measured. BUILD=<dir> picks the build. The tool is a plain build (the
# benchmarks have no ASan build; it runs under ASan when linked by hand with the ASan
# libraries, as its commit says), so the ASan pass would only repeat the plain one: it
# skips (t/skips-allowed).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Temp qw(tempdir);
use Test::More;
use Kvgate::Engine;
use Kvgate::LlamaCpp;

plan skip_all => 'the ASan pass: the tool has no ASan build, the plain pass runs it' if Kvgate::Engine::asan();

my $build = Kvgate::Engine::build_dir();
my $shared = Kvgate::Engine::shared_dir();
my $synth = "$build/bench/synth_gguf";
my $tool = "$build/bench/kv_int8_ref";
my $vocab = "$shared/tokenizers/vectors/ggml-vocab-llama-spm.gguf";
for my $f ($synth, $tool) {
    ok(-x $f, "$f is built") or BAIL_OUT("build it first: make BUILD=$build $f");
}
ok(-f $vocab, "the vocabulary $vocab") or BAIL_OUT('no vocabulary');
my ($lc, $why) = Kvgate::LlamaCpp::install();
ok($lc, "llama.cpp $Kvgate::LlamaCpp::VERSION_PINNED installed") or BAIL_OUT("llama.cpp: $why");
my $dir = tempdir(CLEANUP => 1);

sub run {
    my (@cmd) = @_;
    my $pid = open(my $fh, '-|') // die "fork: $!";
    if (!$pid) {
        open STDERR, '>&', \*STDOUT or die;
        open STDIN, '<', '/dev/null' or die;
        exec @cmd or exit 127;
    }
    local $/;
    my $out = <$fh> // '';
    close $fh;
    return ($? >> 8, $out);
}

my $model = "$dir/tiny.gguf";
my ($rc, $out) = run($synth, '--shape', 'tiny', '--dtype', 'f32', '--vocab', $vocab, '--out', $model);
is($rc, 0, 'tiny llama F32 written') or diag($out);
my @args = ($tool, '--model', $model, '--lib', $lc->{lib}, '--prompts', 2, '--prompt-len', 40, '--steps', 16,
            '--threads', 2, '--full-layers', '0,1,2');
($rc, $out) = run(@args);
is($rc, 0, 'kv_int8_ref runs') or diag($out);
my ($rc2, $out2) = run(@args);
is($rc2, 0, 'and again');
ok($out eq $out2, 'two runs print the same bytes') or diag("first:\n$out\nsecond:\n$out2");

like($out, qr/^kv_int8_ref: lc-f32: K\/V f32\/f32, flash attention off, rotated no$/m, 'llama.cpp: an F32 cache');
like($out, qr/^kv_int8_ref: lc-f16: K\/V f16\/f16, flash attention on, rotated no$/m,
     'llama.cpp: an F16 cache, flash attention on');
like($out, qr/^kv_int8_ref: lc-q8: K\/V q8_0\/q8_0, flash attention on, rotated no$/m,
     'llama.cpp: a q8_0 cache (K and V), flash attention on, no rotation at head 32');
like($out, qr/^kv_int8_ref: kv-i8-2: the model has 2 layers, so it is float32 throughout$/m,
     'kvgate: --full-layers 2 of 2 is float32');

# The summary rows: | what | reference | candidate | n/prompts | shortest | chosen | any |
my %row;
for my $l (split /\n/, $out) {
    my @c = map { s/^\s+|\s+$//gr } split /\|/, $l;
    $row{"$c[2] $c[3]"} = { all => $c[4], shortest => $c[5], chosen => $c[6], any => $c[7] }
        if @c >= 8 && $c[1] =~ /^\([abc]\)/;
}
my %want = map { $_ => 1 } ('lc-f16 lc-q8', 'lc-f32 lc-q8', 'lc-f32 lc-f16', 'kv-f32 kv-i8-0', 'kv-f32 kv-i8-1',
                            'kv-f32 kv-i8-2', 'kv-f32 lc-f32', 'kv-f32 lc-f16');
is_deeply([sort keys %row], [sort keys %want], 'every pair has its summary row (no unrotated q8_0 at head 32)')
    or diag($out);
SKIP: {
    skip 'no summary rows', 5 unless $row{'kv-f32 lc-f32'} && $row{'kv-f32 kv-i8-2'};
    my $a = $row{'kv-f32 lc-f32'};
    ok($a->{all} eq '2/2' && $a->{any} < 2e-5 && $a->{chosen} < 2e-5,
       "the anchor: kvgate float32 = llama.cpp F32 within 2e-5 (any $a->{any}, chosen $a->{chosen}), the same "
       . "greedy tokens ($a->{all})");
    ok($row{'lc-f32 lc-q8'}{any} > 1e-3, "llama.cpp's q8_0 cache moves log-probs ($row{'lc-f32 lc-q8'}{any})");
    ok($row{'kv-f32 kv-i8-0'}{any} > 1e-3, "kvgate's int8 KV moves log-probs ($row{'kv-f32 kv-i8-0'}{any})");
    ok($row{'kv-f32 kv-i8-1'}{any} > 0 && $row{'kv-f32 kv-i8-1'}{any} < $row{'kv-f32 kv-i8-0'}{any},
       "one int8 layer of 2 moves them less ($row{'kv-f32 kv-i8-1'}{any}) than two");
    ok($row{'kv-f32 kv-i8-2'}{any} == 0 && $row{'kv-f32 kv-i8-2'}{chosen} == 0,
       'every layer float32: 0 exactly');
}
my @rows = $out =~ /^  ([KV]): kvgate int8 \(a float scale per 32 values\) (\S+), (\S+); q8_0/mg;
is(scalar @rows, 6, 'K and V rows quantized both ways') or diag($out);
for (my $i = 0; $i + 2 < @rows; $i += 3) {
    ok($rows[$i + 2] <= 1 / 254 + 1e-6, "$rows[$i]: kvgate's largest error is at most max|x| / 254 ($rows[$i + 2])");
}
($rc, $out) = run($tool, '--model', $model, '--lib', $lc->{lib}, '--steps', 0);
is($rc, 2, '--steps 0 is a usage error') or diag($out);
done_testing();
