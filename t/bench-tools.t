#!/usr/bin/env perl
# The benchmark's GGUF writer (build/bench/synth_gguf) cannot rot: a tiny-shape file with
# the real Llama 2 vocabulary loads in kvgate and generates, in F32, F16 and BF16 (and
# the quantized types once the build has src/quant.h); the writer is deterministic; and
# a 15M-shape F32 file holds the weights of synthetic:15M bit for bit (the same prompt
# logits), so t/bench/engine's kvgate and llama.cpp columns run the weights the other
# engine benchmarks use. Speed is never measured here. BUILD=<dir> picks the build.
# The other families (--arch qwen2 ... gpt-oss) are written, deterministically, with
# their architecture and tensor count in the GGUF header; that llama.cpp loads and
# decodes each is checked where the llama.cpp reference runs (kvgate does not run them
# here).
use strict;
use warnings;
use Test::More;
use File::Temp qw(tempdir);
use File::Compare qw(compare);

my $build = $ENV{BUILD} || 'build';
my $shared = $ENV{KVGATE_SHARED} || '../shared';
my $synth = "$build/bench/synth_gguf";
my $gen = "$build/bin/kvgate-generate";
my $vocab = "$shared/tokenizers/vectors/ggml-vocab-llama-spm.gguf";
ok(-x $synth && -x $gen, "$synth and $gen are built")
    or BAIL_OUT("build them first: make BUILD=$build $synth $gen");
plan skip_all => "no vocabulary at $vocab" unless -f $vocab;
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

sub write_gguf {
    my ($shape, $dt, $out) = @_;
    return run($synth, '--shape', $shape, '--dtype', $dt, '--vocab', $vocab, '--out', $out);
}

for my $dt (qw(f32 f16 bf16 q8_0 q4_0 q4_k q6_k)) {
    my $f = "$dir/tiny-$dt.gguf";
    my ($rc, $out) = write_gguf('tiny', $dt, $f);
    SKIP: {
        skip "$dt: this build has no src/quant.h", 3 if $rc == 3;
        is($rc, 0, "tiny $dt written") or diag($out);
        ($rc, $out) = run($gen, '--model', $f, '--prompt', 'Hello world', '--temperature', '0', '--max-tokens', '4',
                          '--stop', 'none', '--threads', '1');
        is($rc, 0, "tiny $dt loads and generates in kvgate") or diag($out);
        my $name = uc $dt;
        like($out, qr/^model: tiny-$dt \(gguf, llama, 2 layers, dim 256, 8\/4 heads, vocab 32000, ctx 256, \Q$name\E\)/m,
             "tiny $dt: the shape, the 32,000-piece vocabulary and the dtype")
            or diag($out);
        # "Hello world" is <s> Hello world in the Llama 2 vocabulary: the tokenizer came along.
        like($out, qr/prompt: 3 tokens; .*generated: 4 tokens/, "tiny $dt: the Llama 2 tokenizer") if $dt eq 'f32';
    }
}

{
    my ($rc, $out) = write_gguf('tiny', 'f32', "$dir/again.gguf");
    is($rc, 0, 'tiny f32 written again');
    is(compare("$dir/tiny-f32.gguf", "$dir/again.gguf"), 0, 'the writer is deterministic');
    ($rc, $out) = run($synth, '--shape', 'nope', '--dtype', 'f32', '--vocab', $vocab, '--out', "$dir/x.gguf");
    is($rc, 2, 'an unknown shape is a usage error');
}

{
    my $f = "$dir/15M-f32.gguf";
    my ($rc, $out) = write_gguf('15M', 'f32', $f);
    is($rc, 0, '15M f32 written') or diag($out);
    my @ids = ('--prompt-ids', '1 450 4996 17354', '--temperature', '0', '--max-tokens', '1', '--threads', '1');
    ($rc, $out) = run($gen, '--model', $f, @ids, '--prompt-logits', "$dir/gguf.txt");
    is($rc, 0, '15M file runs') or diag($out);
    ($rc, $out) = run($gen, '--model', 'synthetic:15M', @ids, '--prompt-logits', "$dir/synth.txt");
    is($rc, 0, 'synthetic:15M runs') or diag($out);
    ok(-s "$dir/gguf.txt" && compare("$dir/gguf.txt", "$dir/synth.txt") == 0,
       'the 15M GGUF file and synthetic:15M give the same prompt logits (same weights)');
}

# The families: the header's architecture and tensor count (the file names and shapes
# were checked against llama.cpp's loader when written; see synth_gguf.c's header).
sub gguf_head {
    my ($path) = @_;
    open(my $fh, '<:raw', $path) or return;
    read($fh, my $h, 4096) or return;
    my ($magic, $ver, $nt, $nkv, $klen) = unpack('a4 V Q< Q< Q<', $h);
    my ($key, $type, $vlen) = unpack("x32 a$klen V Q<", $h);
    my $arch = unpack('x' . (32 + $klen + 12) . "a$vlen", $h);
    return ($magic, $nt, $key, $arch);
}
my %tensors = (qwen2 => 27, qwen3 => 25, qwen3moe => 27, gemma2 => 24, gemma3 => 80, phi3 => 17, mistral3 => 21,
               'gpt-oss' => 41);
for my $arch (sort keys %tensors) {
    my $f = "$dir/$arch.gguf";
    my ($rc, $out) = run($synth, '--arch', $arch, '--shape', 'tiny', '--dtype', 'f32', '--vocab', $vocab, '--out', $f);
    is($rc, 0, "$arch tiny f32 written") or diag($out);
    my ($magic, $nt, $key, $got) = gguf_head($f);
    ok(($magic // '') eq 'GGUF' && $key eq 'general.architecture' && $got eq $arch && $nt == $tensors{$arch},
       "$arch: general.architecture and $tensors{$arch} tensors") or diag("$key=$got, $nt tensors");
    unlink $f;
}
{
    my @a = ('--arch', 'gpt-oss', '--shape', 'tiny', '--dtype', 'mxfp4', '--vocab', $vocab);
    my ($rc, $out) = run($synth, @a, '--out', "$dir/oss1.gguf");
    SKIP: {
        skip 'this build has no src/quant.h', 2 if $rc == 3;
        is($rc, 0, 'gpt-oss tiny mxfp4 written') or diag($out);
        ($rc, $out) = run($synth, @a, '--out', "$dir/oss2.gguf");
        is(compare("$dir/oss1.gguf", "$dir/oss2.gguf"), 0, 'the families are written deterministically too');
    }
    ($rc, $out) = run($synth, '--arch', 'qwen3', '--shape', 'tiny', '--dtype', 'mxfp4', '--vocab', $vocab,
                      '--out', "$dir/x.gguf");
    is($rc, 2, 'mxfp4 is gpt-oss only (a usage error elsewhere)');
    ($rc, $out) = run($synth, '--arch', 'nope', '--shape', 'tiny', '--dtype', 'f32', '--vocab', $vocab,
                      '--out', "$dir/x.gguf");
    is($rc, 2, 'an unknown family is a usage error');
}

done_testing();
