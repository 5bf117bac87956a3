#!/usr/bin/env perl
# make gpu-bundle (scripts/gpu-bundle.sh) from outside, as far as a machine without a GPU
# allows: the bundle builds with nvcc, is under 64 MiB, its binaries need only glibc and
# CUDA libraries (readelf NEEDED and ldd), start and print --help, and fail at once with a
# CUDA error message for --backend cuda on this GPU-less machine; then the bundle's run.sh
# runs its steps emulated (KVG_RUN_EMU=1: the build/emu binaries, tiny models), when
# `make emu` has built them; its bench steps run both attention paths (own, cudnn), each
# labelled in results.json, and a cuDNN without the paged SDPA op makes the cudnn step
# "unsupported" (KVG_EMU_CUDNN_VERSION), not a failure; its host-tier steps (tiers-8k,
# tiers-32k: a short prompt on the tiny shape) pass, their JSON holding the figures.
#
# Skipped without nvcc. The bundle links the libraries of $BUILD (KVG_BUNDLE_OBJ=$BUILD:
# the objects `make` built already; so only the links run here). The ASan pass skips: the
# bundle is no ASan build, the plain pass checks it.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Find;
use File::Temp qw(tempdir);
use JSON::PP;
use Test::More;
use Time::HiRes qw(time);
use Kvgate::Engine;

plan skip_all => 'the bundle is not an ASan build; the plain run checks it' if Kvgate::Engine::asan();
my $nvcc = $ENV{NVCC} || (grep { -x } map { "$_/nvcc" } split(/:/, $ENV{PATH} // ''), '/usr/local/cuda/bin')[0];
plan skip_all => 'nvcc not found: the GPU bundle is built with CUDA' unless $nvcc && -x $nvcc;

my $root = Kvgate::Engine::repo_root();
my $build = $ENV{BUILD} || 'build';
$build = "$root/$build" unless $build =~ m{^/};
my $bundle = "$build/gpu-bundle";
my $dir = tempdir('kvgate-bundle-XXXXXX', TMPDIR => 1, CLEANUP => 1);

sub slurp { my ($f) = @_; open my $fh, '<:raw', $f or return ''; local $/; my $s = <$fh>; $s // '' }

# Runs a command with a time limit; returns (exit status, stdout+stderr, seconds).
sub run {
    my ($limit, @cmd) = @_;
    my $log = "$dir/out.log";
    my $t0 = time;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open STDIN, '<', '/dev/null' or die;
        open STDOUT, '>', $log or die;
        open STDERR, '>&', \*STDOUT or die;
        exec @cmd or exit 127;
    }
    my $rc;
    eval {
        local $SIG{ALRM} = sub { die "timeout\n" };
        alarm $limit;
        waitpid($pid, 0);
        $rc = $? >> 8;
        alarm 0;
    };
    if ($@) {
        kill 'KILL', $pid;
        waitpid($pid, 0);
        $rc = -1;
    }
    return ($rc, slurp($log), time - $t0);
}

{
    local $ENV{KVG_BUNDLE_OBJ} = $ENV{KVG_BUNDLE_OBJ} // $build;
    local $ENV{NVCC} = $nvcc;
    my ($rc, $out, $secs) = run(900, 'make', '-s', '-C', $root, "BUILD=$build", 'gpu-bundle');
    is($rc, 0, sprintf('make gpu-bundle builds (%.1f s)', $secs)) or diag($out);
    diag(sprintf('make gpu-bundle: %.1f s', $secs));
}
unless (-d $bundle) {               # the other checks need it; the rest of the suite does not
    done_testing();
    exit 1;
}
my $info = slurp("$bundle/BUILD-INFO");
my $real = $info =~ /^cuda backend: real/m;
note($info);

my $size = 0;
find(sub { $size += -s $_ if -f $_ }, $bundle);
cmp_ok($size, '<', 64 * 1024 * 1024, sprintf('the bundle is under 64 MiB (%.1f MiB)', $size / 1048576));

my @bins = map { "$bundle/$_" } qw(bin/kvgate-engine bin/kvgate-generate bin/kvgate-gpu-check bench/gpu_bench
                                   bench/tiers_gpu_bench);
for my $f (@bins, map { "$bundle/models/stories260K/$_" } qw(stories260K.bin tok512.bin golden-greedy.json)) {
    ok(-f $f, "bundle holds " . substr($f, length($bundle) + 1));
}
ok(-x "$bundle/run.sh" && -f "$bundle/README.md", 'bundle holds run.sh and README.md');
ok(-x "$bundle/torch_ref.py", 'bundle holds torch_ref.py (the torch step)');

# What the binaries may need: glibc and CUDA. ldd also lists what the CUDA libraries pull
# in themselves (cuBLAS needs libgcc_s, cuDNN libstdc++ too), which the binaries do not name.
my $glibc = qr/^(?:libc|libm|libpthread|libdl|librt|ld-linux-x86-64|linux-vdso)\.so/;
my $cuda = qr/^(?:libcudart|libcublas|libcublasLt|libcudnn)\.so/;
for my $b (@bins) {
    my $name = substr($b, length($bundle) + 1);
    my @needed = slurp_cmd('readelf', '-d', $b) =~ /\(NEEDED\)\s+Shared library: \[([^\]]+)\]/g;
    my @bad = grep { $_ !~ $glibc && $_ !~ $cuda } @needed;
    ok(@needed && !@bad, "$name names only glibc and CUDA libraries (" . join(' ', @needed) . ")")
        or diag("unexpected: @bad");
    my $ldd = slurp_cmd('ldd', $b);
    my @libs = map { (split ' ', $_)[0] } grep { /\S/ } split /\n/, $ldd;
    my @extra = grep { $_ !~ $glibc && $_ !~ $cuda && !/^\/lib64\/ld-linux/ && !/^(?:libgcc_s|libstdc\+\+)\.so/ } @libs;
    ok(!@extra, "ldd $name: glibc and CUDA only") or diag($ldd);
    my ($rc, $out) = run(20, $b, '--help');
    ok($rc == 0 && $out =~ /usage/i, "$name --help") or diag($out);
}

sub slurp_cmd {
    my (@cmd) = @_;
    open my $fh, '-|', @cmd or return '';
    local $/;
    my $s = <$fh> // '';
    close $fh;
    return $s;
}

# --backend cuda on this machine: no GPU (or, while engine/cuda is the stub, no CUDA in the
# build): a message naming the reason, at once.
my @stories = ('--model', "$bundle/models/stories260K/stories260K.bin",
               '--tokenizer', "$bundle/models/stories260K/tok512.bin");
my $why = $real ? qr/cuda.*(?:no CUDA-capable device|driver|cudaError|device)/is : qr/built without CUDA/;
{
    my ($rc, $out, $secs) = run(30, "$bundle/bin/kvgate-gpu-check", @stories, '--backend', 'cuda', '--check', 'golden');
    ok($rc == 1 && $out =~ $why, 'kvgate-gpu-check --backend cuda fails with the CUDA reason') or diag($out);
    cmp_ok($secs, '<', 10, 'and fails fast');
    ($rc, $out) = run(30, "$bundle/bin/kvgate-generate", @stories, '--backend', 'cuda', '--prompt', 'Once', '--max-tokens', '2');
    ok($rc == 1 && $out =~ $why, 'kvgate-generate --backend cuda fails with the CUDA reason') or diag($out);
    ($rc, $out) = run(30, "$bundle/bin/kvgate-gpu-check", @stories, '--backend', 'cpu', '--check', 'golden',
                      '--golden-cases', '1');
    ok($rc == 0 && $out =~ /golden: pass/, 'the bundle checks golden ids on the CPU backend') or diag($out);
}

# A GPU machine with PyTorch keeps cuBLAS in its Python packages (nvidia/cublas/lib...):
# run.sh finds them through python3 and puts them first on LD_LIBRARY_PATH, then the
# binaries load them from there. Here a package folder holding a link to this machine's
# libcublasLt stands for one (the info step, on the CPU backend).
SKIP: {
    my ($lt) = glob('/usr/local/cuda/lib64/libcublasLt.so.[0-9]*');
    my ($py) = grep { system("$_ -c 'import sys' >/dev/null 2>&1") == 0 } 'python3', '/usr/bin/python3';
    skip 'no libcublasLt in /usr/local/cuda/lib64 or no python3', 2 unless $lt && $py && $real;
    my $pkg = "$dir/py/nvidia/cublas/lib";
    system('mkdir', '-p', $pkg) == 0 or die "mkdir $pkg";
    symlink($lt, "$pkg/" . ($lt =~ s{.*/}{}r)) or die "symlink: $!";
    local $ENV{PYTHONPATH} = "$dir/py";
    local $ENV{KVG_BACKEND} = 'cpu';
    local $ENV{KVG_STEPS} = 'info';
    local $ENV{OUT} = "$dir/out-libs";
    my ($rc, $out) = run(60, "$bundle/run.sh");
    ok($rc == 0 && $out =~ m{CUDA libraries from Python's nvidia packages: \Q$pkg\E}, 'run.sh finds cuBLAS in a Python nvidia package')
        or diag($out);
    like($out, qr{loads libcublasLt\S* from \Q$pkg\E/}, 'and the binaries load it from there');
}

# On a machine without a GPU, run.sh says so after the info step and exits non-zero
# (every step would fail the same way).
SKIP: {
    skip 'this machine has a GPU: run.sh would run for real', 4
        if system('nvidia-smi -L >/dev/null 2>&1') == 0;
    local $ENV{OUT} = "$dir/out-nogpu";
    my ($rc, $out, $secs) = run(120, "$bundle/run.sh");
    is($rc, 1, sprintf('run.sh without a GPU exits 1 (%.1f s)', $secs));
    like($out, qr/^info\s+pass/m, 'after the info step');
    like($out, qr/FAILED: no usable GPU here: .*cuda/i, 'saying why') or diag($out);
    my $res = eval { decode_json(slurp("$dir/out-nogpu/results.json")) };
    ok($res && !$res->{ok} && join(',', map { "$_->{name}:$_->{status}" } @{ $res->{steps} }) eq 'info:pass,device:fail',
       'results.json: info passed, device failed') or diag(slurp("$dir/out-nogpu/results.json"));
}

# The emulated steps of the bundle's run.sh (stories260K and synthetic:260K, tiny sizes).
SKIP: {
    my $emu_check = "$build/emu/bin/kvgate-gpu-check";
    my $emu_bench = "$build/emu/bench/gpu_bench";
    my $emu_tiers = "$build/emu/bench/tiers_gpu_bench";
    skip "the emulated binaries are not built ($emu_check, $emu_bench, $emu_tiers: make emu)", 10
        unless -x $emu_check && -x $emu_bench && -x $emu_tiers;
    local $ENV{KVG_RUN_EMU} = 1;
    # What this checks is run.sh (its steps, their JSON, the summary), not the kernels: the
    # emulator's strict checks (provenance, races), over half of its time, are off here;
    # the kernels run under them in t/unit/cuda_*.c and t/engine-families.t.
    local $ENV{KVG_EMU_STRICT} = 0;
    local $ENV{KVG_BIN} = "$build/emu/bin";
    local $ENV{KVG_BENCH} = $emu_bench;
    local $ENV{KVG_TIERS_BENCH} = $emu_tiers;
    local $ENV{OUT} = "$dir/out";
    my ($rc, $out, $secs) = run(600, "$bundle/run.sh");
    is($rc, 0, sprintf('run.sh, emulated, passes (%.1f s)', $secs)) or diag($out);
    diag(sprintf('run.sh emulated: %.1f s', $secs));
    my $res = eval { decode_json(slurp("$dir/out/results.json")) };
    ok($res && $res->{ok} && $res->{emulated}, 'results.json says ok, emulated') or diag($@ // $out);
    my @bad = grep { $_->{status} ne 'pass' && $_->{status} ne 'skipped' } @{ $res->{steps} // [] };
    ok($res && @{ $res->{steps} } >= 8 && !@bad, 'every step passed or was skipped')
        or diag(join ', ', map { "$_->{name}: $_->{status}" } @bad);

    # The bench's attention paths side by side, each labelled: own (invariant on and off)
    # and cudnn (off), the same configuration.
    my %bench = map { $_->{name} => $_ } grep { $_->{name} =~ /^bench-/ } @{ $res->{steps} // [] };
    my $modes = sub {
        my ($s) = @_;
        return join ',', map { $_->{batch_invariant} ? 'on' : 'off' } @{ $s->{result}{models}[0]{modes} // [] };
    };
    my ($own, $cudnn) = @bench{qw(bench-0-own bench-0-cudnn)};
    ok($own && $own->{status} eq 'pass' && $own->{attention} eq 'own' && $modes->($own) eq 'on,off',
       'results.json: bench-0-own, attention own, batch-invariant on and off')
        or diag(encode_json($own // {}));
    ok($cudnn && $cudnn->{status} eq 'pass' && $cudnn->{attention} eq 'cudnn' && $modes->($cudnn) eq 'off',
       'results.json: bench-0-cudnn, attention cudnn, batch-invariant off')
        or diag(encode_json($cudnn // {}));
    like($out, qr/^== bench-0-own: attention own, pass.*^== bench-0-cudnn: attention cudnn, pass/ms,
         'the summary labels both bench results with their attention path');

    # The host tier's steps: each passed (the host hit's logits equal the recompute's, the
    # blocks went through the host tier), and its JSON has the figures: as many blocks
    # copied back as the prompt has before its last token's block, their bytes, positive
    # times and bandwidth.
    for my $t (qw(tiers-8k tiers-32k)) {
        my ($st) = grep { $_->{name} eq $t } @{ $res->{steps} // [] };
        my $r = $st && $st->{result} // {};
        my @num = qw(recompute_ms device_hit_ms host_hit_ms h2d_ms h2d_gbs speedup_host speedup_device evict_ms d2h_gbs);
        my @miss = grep { !defined $r->{$_} || $r->{$_} <= 0 } @num;
        ok($st && $st->{status} eq 'pass' && $r->{tool} && $r->{tool} eq 'tiers_gpu_bench' && !@miss
           && $r->{logits_identical} && $r->{block_tokens} > 0 && $r->{prompt} > $r->{block_tokens}
           && $r->{cached_tokens} == int(($r->{prompt} - 1) / $r->{block_tokens}) * $r->{block_tokens}
           && $r->{blocks_copied} == $r->{cached_tokens} / $r->{block_tokens}
           && $r->{bytes_copied} == $r->{blocks_copied} * $r->{block_bytes}
           && $r->{evict_blocks} >= $r->{blocks_copied},
           "results.json: $t passed, with the host tier's figures")
            or diag(encode_json($st // {}) . (@miss ? " (missing or not positive: @miss)" : ''));
    }
    like($out, qr/^tiers-8k\s+pass.*\n(?:\s+.*\n)*?\s+TTFT host hit/m, 'the summary shows the host hit\'s TTFT');

    # A cuDNN without the paged SDPA op (the emulator's cudnnGetVersion says 9.10): the cudnn
    # step is "unsupported", its reason recorded, and the run still passes.
    local $ENV{KVG_EMU_CUDNN_VERSION} = 91000;
    local $ENV{KVG_STEPS} = 'bench';
    local $ENV{OUT} = "$dir/out-nocudnn";
    ($rc, $out, $secs) = run(300, "$bundle/run.sh");
    is($rc, 0, sprintf('run.sh, emulated, with a cuDNN lacking the op passes (%.1f s)', $secs)) or diag($out);
    $res = eval { decode_json(slurp("$dir/out-nocudnn/results.json")) };
    my %st = map { $_->{name} => $_ } @{ $res->{steps} // [] };
    ok($res && $res->{ok} && $st{'bench-0-own'} && $st{'bench-0-own'}{status} eq 'pass'
       && $st{'bench-0-cudnn'} && $st{'bench-0-cudnn'}{status} eq 'unsupported'
       && $st{'bench-0-cudnn'}{attention} eq 'cudnn'
       && ($st{'bench-0-cudnn'}{result}{unsupported} // '') =~ /KVGATE_CUDA_ATTENTION=cudnn: .*cuDNN 9\.10\.0 has no paged SDPA/,
       'results.json: bench-0-cudnn unsupported, with the reason; bench-0-own passed')
        or diag(slurp("$dir/out-nocudnn/results.json"));
    like($out, qr/^bench-0-cudnn\s+unsupported.*\n\s+.*no paged SDPA/m, 'the summary says why')
        or diag($out);
}

done_testing();
