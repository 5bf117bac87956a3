#!/usr/bin/env perl
# The engine daemon on the CUDA backend, emulated (build/emu/bin/kvgate-engine: the same
# kernels and host code as on a GPU, run on the host by kernels/emu/): through the channel it
# gives the reference greedy answer, serves n samples from the prefix cache in device memory
# (miss, then hit with the same answers), and a failing cuBLAS call fails only the request of
# that step, with the call named, while the engine goes on serving.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Temp qw(tempdir tempfile);
use JSON::PP;
use Test::More;
use Kvgate::Engine;
use Kvgate::Test;

my $build = $ENV{BUILD} || 'build';
$build = "$FindBin::Bin/../$build" unless $build =~ m{^/};
my $emu_engine = "$build/emu/bin/kvgate-engine";
plan skip_all => "no emulated engine ($emu_engine: make emu)" unless -x $emu_engine;
# The emulated engine has no ASan build; its kernels run under ASan in build/asan/t/cuda_*.
plan skip_all => 'the ASan pass: the emulated kernels are checked by build/asan/t/cuda_backend'
    if Kvgate::Engine::asan();

my $cli = Kvgate::Engine::bin('kvgate-cli');
my $shared = Kvgate::Engine::shared_dir();
my $dir = tempdir('kvgate-cuda-XXXXXX', TMPDIR => 1, CLEANUP => 1);
my $sock = "$dir/engine.sock";
my @engine = (socket => $sock, bin => $emu_engine, extra => [ '--backend', 'cuda', '--kv-memory', '16M' ]);

sub slurp { my ($f) = @_; open my $fh, '<:raw', $f or die "$f: $!"; local $/; my $s = <$fh>; $s // '' }

sub run {
    my (@cmd) = @_;
    my (undef, $out) = tempfile(UNLINK => 1);
    my (undef, $err) = tempfile(UNLINK => 1);
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open STDIN, '<', '/dev/null' or die;
        open STDOUT, '>', $out or die;
        open STDERR, '>', $err or die;
        exec @cmd or exit 127;
    }
    waitpid $pid, 0;
    return ($? >> 8, slurp($out), slurp($err));
}

my $golden = JSON::PP->new->decode(slurp("$shared/models/stories260K/golden-greedy.json"));
my $c0 = $golden->{cases}[0];
my $ng = scalar @{ $c0->{greedy_ids} };
my @greedy = ('--socket', $sock, '--prompt', $c0->{prompt}, '--temperature', '0', '--max-tokens', $ng, '--json');

my $e = Kvgate::Engine->start(@engine);
like($e->ready_line, qr/KV pool \d+ blocks of 16 tokens.*backend cuda \(kvgate emulated device/,
     'the readiness line names the CUDA backend and its device');
{
    my ($rc, $out, $err) = run($cli, @greedy);
    my $j = eval { JSON::PP->new->decode($out) } // {};
    is($rc, 0, 'greedy completion on the CUDA backend: exit 0') or diag($err);
    is_deeply($j->{choices}[0]{token_ids}, $c0->{greedy_ids}, '  the reference greedy ids');
}
{
    my $doc = join ' ', map { $_->{full_text} } @{ $golden->{cases} }[0 .. 1];
    my ($fh, $docfile) = tempfile(UNLINK => 1);
    print $fh $doc;
    close $fh;
    my @req = ('--socket', $sock, '--prompt-file', $docfile, '--temperature', '0.8', '--seed', '5', '--n', '3',
               '--max-tokens', '12', '--json', '--tenant', 'acme');
    my ($rc, $out, $err) = run($cli, @req);
    my $a = eval { JSON::PP->new->decode($out) } // {};
    is($rc, 0, 'n=3 over a long prompt: exit 0') or diag($err);
    is($a->{cache}, 'miss', '  first time: miss');
    ($rc, $out, $err) = run($cli, @req);
    my $b = eval { JSON::PP->new->decode($out) } // {};
    is($b->{cache}, 'hit', '  second time: hit, from the pool in device memory');
    ok(($b->{usage}{prompt_tokens_details}{cached_tokens} // 0) > 0,
       "  $b->{usage}{prompt_tokens_details}{cached_tokens} cached tokens");
    is_deeply([ map { $_->{token_ids} } @{ $b->{choices} } ], [ map { $_->{token_ids} } @{ $a->{choices} } ],
              '  the same three answers cached and uncached');
}
is($e->stop, 0, 'SIGTERM: exit 0');

# The 200th GEMM fails: that step's request gets an error naming the call; the engine
# logs it and serves the next requests normally. (Without CUDA graphs: a replayed decode
# step makes no cuBLASLt call, and a capture that fails is run again eagerly.)
{
    local $ENV{KVG_EMU_FAIL} = 'cublasLtMatmul:200';
    local $ENV{KVGATE_CUDA_GRAPHS} = '0';
    $e->restart;
}
{
    my ($rc, $out, $err) = run($cli, @greedy);
    isnt($rc, 0, 'a failing cuBLAS call: the request fails');
    like($err, qr/cuda: cublasLtMatmul \(layer \d+ \w+, M=\d+ N=\d+ K=\d+\) failed: CUBLAS_STATUS_EXECUTION_FAILED.* in step \d+/,
         '  with the call, the layer, the shape and the step named');
    ($rc, $out, $err) = run($cli, @greedy);
    my $j = eval { JSON::PP->new->decode($out) } // {};
    is($rc, 0, 'the next request works') or diag($err);
    is_deeply($j->{choices}[0]{token_ids}, $c0->{greedy_ids}, '  with the reference answer');
    ok(Kvgate::Test->wait_for(sub { $e->log =~ /step failed: cuda: cublasLtMatmul/ }, "the failed step in the engine log"),
       'the engine logged the failed step');
}
is($e->stop, 0, 'SIGTERM: exit 0');
unlike($e->log, qr/AddressSanitizer|runtime error|kvg-emu:/, 'no sanitizer or emulator reports');

# With CUDA graphs (the default) the third graph launch fails (cudaErrorInvalidValue, not
# sticky): that decode step's request fails naming the launch; the next request works.
{
    local $ENV{KVG_EMU_FAIL} = 'cudaGraphLaunch:3:1';
    $e->restart;
}
{
    my ($rc, $out, $err) = run($cli, @greedy);
    isnt($rc, 0, 'a failing graph launch: the request fails');
    like($err, qr/cuda: cudaGraphLaunch \(end_step, the step's graph\) failed: cudaErrorInvalidValue.* in step \d+/,
         '  with the call and the step named');
    ($rc, $out, $err) = run($cli, @greedy);
    my $j = eval { JSON::PP->new->decode($out) } // {};
    is($rc, 0, 'the next request works') or diag($err);
    is_deeply($j->{choices}[0]{token_ids}, $c0->{greedy_ids}, '  with the reference answer, from graphs');
}
is($e->stop, 0, 'SIGTERM: exit 0');
unlike($e->log, qr/AddressSanitizer|runtime error|kvg-emu:/, 'no sanitizer or emulator reports');

done_testing;
