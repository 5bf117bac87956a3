#!/usr/bin/env perl
# build/bin/kvgate-engine and build/bin/kvgate-cli from outside: usage and startup
# errors, the readiness line, greedy answers equal to the llama2.c reference, --json
# with n samples, usage and cached tokens (hit on the second request, miss under another
# tenant, bypass for short prompts), --stream text equal to --json text, a clear error
# when no engine listens, SIGTERM exits 0 and removes the socket.
# With KVGATE_ASAN=1 both binaries are the ASan builds.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Temp qw(tempdir tempfile);
use JSON::PP;
use Test::More;
use Kvgate::Engine;

my $engine_bin = Kvgate::Engine::bin('kvgate-engine');
my $cli_bin = Kvgate::Engine::bin('kvgate-cli');
ok(-x $engine_bin && -x $cli_bin, "$engine_bin and $cli_bin are built")
    or BAIL_OUT('build them first: make');
my $shared = Kvgate::Engine::shared_dir();
my $dir = tempdir('kvgate-cli-XXXXXX', TMPDIR => 1, CLEANUP => 1);
my $sock = "$dir/engine.sock";

sub slurp { my ($f) = @_; open my $fh, '<:raw', $f or die "$f: $!"; local $/; my $s = <$fh>; $s // '' }

# Runs a command; returns (exit status, stdout, stderr).
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

# ---- usage and startup errors ----------------------------------------------------------

{
    my ($rc, $out) = run($engine_bin, '--help');
    is($rc, 0, 'kvgate-engine --help exits 0');
    like($out, qr/--socket-group NAME.*--kv-memory SIZE.*--warmup FILE/s, '  and lists the options');
    ($rc, undef, my $err) = run($engine_bin, '--socket', $sock);
    is($rc, 2, 'no --model: exit 2');
    like($err, qr/--model is required/, '  says so');
    ($rc, undef, $err) = run($engine_bin, '--model', 'x', '--socket', $sock, '--kv-memory', 'lots');
    is($rc, 2, 'bad --kv-memory: exit 2');
    like($err, qr/--kv-memory: 'lots' is not a size/, '  names the option and value');
    ($rc, undef, $err) = run($engine_bin, '--model', "$dir/missing.bin", '--socket', $sock);
    is($rc, 1, 'a missing model file: exit 1');
    like($err, qr/\Q$dir\E\/missing\.bin: cannot open/, '  names the file');
    ($rc, undef, $err) = run($engine_bin, Kvgate::Engine::stories_args(), '--socket', $sock,
                             '--socket-group', 'no-such-group-kvgate');
    is($rc, 2, 'unknown --socket-group: exit 2');
    like($err, qr/no group named 'no-such-group-kvgate'/, '  says so');
    ($rc, undef, $err) = run($engine_bin, Kvgate::Engine::stories_args(), '--socket', $sock,
                             '--chat-template', 'jinja');
    is($rc, 2, 'unknown --chat-template: exit 2');
    like($err, qr/chatml/, '  lists the accepted names');
    ($rc, undef, $err) = run($cli_bin, '--socket', "$dir/nobody.sock", '--prompt', 'hi');
    is($rc, 1, 'kvgate-cli without an engine: exit 1');
    like($err, qr/nobody\.sock: no engine is listening/, '  says no engine is listening');
    ($rc, undef, $err) = run($cli_bin, '--socket', $sock);
    is($rc, 2, 'kvgate-cli without a prompt: exit 2');
    like($err, qr/exactly one of --prompt/, '  says what is missing');
    ($rc, undef, $err) = run($cli_bin, '--socket', $sock, '--prompt', 'x', '--n', '99');
    is($rc, 2, 'kvgate-cli --n 99: exit 2');
    ($rc, undef, $err) = run($cli_bin, '--socket', $sock, '--prompt', 'x', '--repeat', '0');
    is($rc, 2, 'kvgate-cli --repeat 0: exit 2');
    like($err, qr/--repeat: '0' is not a positive integer/, '  names the option and value');
}

# ---- serving ---------------------------------------------------------------------------

my $e = Kvgate::Engine->start(socket => $sock);
like($e->ready_line, qr/^kvgate-engine: ready on \Q$sock\E: model stories260K \(llama2c, id [0-9a-f]{16}, context 512, vocabulary 512\), KV pool \d+ blocks of 16 tokens/,
     'readiness line names the socket, model, pool');
ok(-S $sock, 'the socket exists');
is(sprintf('%04o', (stat $sock)[2] & 07777), '0666', '  with --socket-mode 0666');

my $golden = JSON::PP->new->decode(slurp("$shared/models/stories260K/golden-greedy.json"));
my $c0 = $golden->{cases}[0];
my $want = substr($c0->{full_text}, length $c0->{prompt});
my $ng = scalar @{ $c0->{greedy_ids} };
{
    my ($rc, $out, $err) = run($cli_bin, '--socket', $sock, '--prompt', $c0->{prompt}, '--temperature', '0',
                               '--max-tokens', $ng);
    is($rc, 0, 'greedy completion: exit 0') or diag($err);
    is($out, "$want\n", 'the streamed text is the reference continuation');
    like($err, qr/5 prompt tokens \(0 cached, bypass\), $ng completion tokens; first token after [\d.]+ ms/,
         'summary on stderr');
    ($rc, $out) = run($cli_bin, '--socket', $sock, '--prompt', $c0->{prompt}, '--temperature', '0',
                      '--max-tokens', $ng, '--json');
    my $j = eval { JSON::PP->new->decode($out) } // {};
    is_deeply($j->{choices}[0]{token_ids}, $c0->{greedy_ids}, '--json: token ids equal the reference');
    is($j->{choices}[0]{text}, $want, '--json: the same text');
    is($j->{cache}, 'bypass', '--json: a 5-token prompt bypasses the cache');
}

my $doc = join ' ', map { $_->{full_text} } @{ $golden->{cases} }[0 .. 1];
my ($fh, $docfile) = tempfile(UNLINK => 1);
print $fh $doc;
close $fh;
my @req = ('--socket', $sock, '--prompt-file', $docfile, '--temperature', '0.8', '--seed', '9', '--n', '3',
           '--max-tokens', '16', '--json');
{
    my ($rc, $out, $err) = run($cli_bin, @req, '--tenant', 'acme');
    my $a = eval { JSON::PP->new->decode($out) } // {};
    is($rc, 0, 'n=3 over a long prompt: exit 0') or diag($err);
    is(scalar @{ $a->{choices} // [] }, 3, '  three choices');
    is($a->{cache}, 'miss', '  first time: miss');
    ok($a->{usage}{prompt_tokens} >= 128, "  prompt of $a->{usage}{prompt_tokens} tokens");
    ($rc, $out) = run($cli_bin, @req, '--tenant', 'acme');
    my $b = eval { JSON::PP->new->decode($out) } // {};
    is($b->{cache}, 'hit', '  second time: hit');
    ok($b->{usage}{prompt_tokens_details}{cached_tokens} > 0,
       "  with $b->{usage}{prompt_tokens_details}{cached_tokens} cached tokens");
    is_deeply([ map { $_->{token_ids} } @{ $b->{choices} } ], [ map { $_->{token_ids} } @{ $a->{choices} } ],
              '  and the same three answers');
    ($rc, $out) = run($cli_bin, @req, '--tenant', 'other');
    my $c = eval { JSON::PP->new->decode($out) } // {};
    is($c->{cache}, 'miss', 'another tenant: miss');
    is($c->{usage}{prompt_tokens_details}{cached_tokens}, 0, '  0 cached tokens');
    ($rc, $out) = run($cli_bin, grep({ $_ ne '--json' } @req), '--n', '1', '--tenant', 'acme', '--stream');
    like($out, qr/^\Q$a->{choices}[0]{text}\E\n$/, '--stream prints the same text as --json');
    # --repeat: the same request again and again over one connection, each answered whole.
    ($rc, $out, $err) = run($cli_bin, @req, '--tenant', 'fresh', '--repeat', '3');
    my @r = map { eval { JSON::PP->new->decode($_) } // {} } split /\n/, $out;
    is($rc, 0, '--repeat 3: exit 0') or diag($err);
    is(scalar @r, 3, '  three answers');
    is_deeply([ map { $_->{cache} // '' } @r ], [qw(miss hit hit)], '  a miss, then two hits');
    is_deeply([ map { [ map { $_->{token_ids} } @{ $_->{choices} // [] } ] } @r ],
              [ ([ map { $_->{token_ids} } @{ $a->{choices} } ]) x 3 ], '  each the same three answers');
}

# ---- --backend cuda --------------------------------------------------------------------
# The emulated binaries (make emu: the CUDA backend on the host) give the no-device and
# old-driver cases deterministically; the real binary's outcome depends on the machine.
{
    my $build = $ENV{BUILD} || 'build';
    $build = "$FindBin::Bin/../$build" unless $build =~ m{^/};
    my ($emu_engine, $emu_gen) = ("$build/emu/bin/kvgate-engine", "$build/emu/bin/kvgate-generate");
    my @gen = (Kvgate::Engine::stories_args(), '--prompt-ids', '1 403 407', '--max-tokens', '8', '--ids',
               '--temperature', '0');
    SKIP: {
        skip 'no emulated binaries (make emu)', 16 unless -x $emu_engine && -x $emu_gen;
        my ($rc, $out, $err);
        {
            local $ENV{KVG_EMU_DEVICES} = '0';
            ($rc, undef, $err) = run($emu_engine, Kvgate::Engine::stories_args(), '--socket', $sock,
                                     '--backend', 'cuda');
            is($rc, 1, 'no GPU: kvgate-engine --backend cuda exits 1');
            like($err, qr/cuda: no CUDA device: cudaGetDeviceCount: cudaErrorNoDevice \(.+\)/,
                 '  naming the CUDA error and its meaning');
        }
        {
            local $ENV{KVG_EMU_DRIVER} = 'old';
            ($rc, undef, $err) = run($emu_gen, @gen, '--backend', 'cuda');
            is($rc, 1, 'an old driver: kvgate-generate --backend cuda exits 1');
            like($err, qr/driver.*cudaErrorInsufficientDriver/, '  says the driver is too old');
        }
        ($rc, undef, $err) = run($emu_gen, @gen, '--backend', 'cuda', '--device', '3');
        is($rc, 1, '--device 3 of 1: exit 1');
        like($err, qr/--device 3: this machine has 1 CUDA device/, '  says how many there are');
        ($rc, undef, $err) = run($emu_gen, @gen, '--backend', 'cuda', '--batch-invariant', 'maybe');
        is($rc, 2, '--batch-invariant maybe: exit 2');
        my ($rc_cpu, $out_cpu) = run($emu_gen, @gen);
        ($rc, $out, $err) = run($emu_gen, @gen, '--backend', 'cuda');
        is($rc, 0, 'emulated kvgate-generate --backend cuda runs');
        like($err, qr/backend cuda \(.+, sm_\d+, device 0\)/, '  the summary names the device');
        is($out, $out_cpu, '  greedy ids equal to the CPU backend\'s');
        # int8 KV on the CUDA backend: generate, and an engine that says its layout and serves
        ($rc, $out, $err) = run($emu_gen, @gen, '--backend', 'cuda', '--kv-dtype', 'int8',
                                '--kv-full-precision-layers', '1');
        is($rc, 0, 'emulated kvgate-generate --backend cuda --kv-dtype int8 runs') or diag($err);
        like($out, qr/^\d+( \d+){7}\s*$/, '  8 greedy ids');
        my $s8 = "$sock.cuda8";
        my $e8 = Kvgate::Engine->start(socket => $s8, bin => $emu_engine,
                                       extra => [ '--backend', 'cuda', '--kv-dtype', 'int8' ]);
        like($e8->log, qr/KV int8: layers 0\.\.2 BF16, 3\.\.4 int8: (\d+) bytes a block \(BF16: (\d+)\)/,
             'emulated engine --backend cuda --kv-dtype int8 starts, saying its layout and block size');
        my @r8 = ('--socket', $s8, '--prompt-file', $docfile, '--temperature', '0', '--max-tokens', '8', '--json',
                  '--tenant', 'acme');
        my ($rc1, $o1) = run($cli_bin, @r8);
        my ($rc2, $o2) = run($cli_bin, @r8);
        my ($a8, $b8) = map { eval { JSON::PP->new->decode($_) } // {} } ($o1, $o2);
        ok($rc1 == 0 && $rc2 == 0 && @{ $a8->{choices}[0]{token_ids} // [] } == 8, '  serves a request, twice');
        ok(($b8->{cache} // '') eq 'hit', '  the second a cache hit') or diag($o2);
        is_deeply($b8->{choices}[0]{token_ids}, $a8->{choices}[0]{token_ids}, '  the hit answers the miss\'s tokens');
        is($e8->stop, 0, '  SIGTERM exits 0');
    }
    my $gen_bin = Kvgate::Engine::bin('kvgate-generate');
    SKIP: {
        skip "$gen_bin not built", 2 unless -x $gen_bin;
        my ($rc, undef, $err) = run($gen_bin, @gen, '--backend', 'cuda');
        skip 'this machine runs CUDA', 2 if $rc == 0;
        isnt($rc, 0, 'real binary --backend cuda without a usable GPU fails');
        like($err, qr/built without CUDA|cuda: .*cuda[A-Z]\w+ \(/, '  with the CUDA error named (or: built without CUDA)');
    }
}

# ---- int8 KV (--kv-dtype int8) ----------------------------------------------------------
{
    my ($rc, $out, $err) = run($engine_bin, '--help');
    like($out, qr/--kv-dtype auto\|int8.*--kv-full-precision-layers N.*every layer/s,
         '--help lists --kv-dtype and --kv-full-precision-layers');
    ($rc, undef, $err) = run($engine_bin, '--model', 'x', '--socket', $sock, '--kv-dtype', 'fp8');
    is($rc, 2, 'bad --kv-dtype: exit 2');
    like($err, qr/--kv-dtype: 'fp8' is not auto or int8/, '  names the option and value');
    ($rc, undef, $err) = run($engine_bin, '--model', 'x', '--socket', $sock, '--kv-full-precision-layers', '-1');
    is($rc, 2, 'bad --kv-full-precision-layers: exit 2');
    like($err, qr/--kv-full-precision-layers: '-1' is not an integer/, '  names the option and value');

    my $s8 = "$dir/int8.sock";
    my $e8 = Kvgate::Engine->start(socket => $s8, extra => [ '--kv-dtype', 'int8' ]);
    like($e8->log, qr/KV int8: layers 0\.\.2 float32, 3\.\.4 int8: \d+ bytes a block \(float32: \d+\)/,
         'int8 engine: says which layers are int8 and the block size');
    my @r8 = ('--socket', $s8, '--prompt-file', $docfile, '--temperature', '0', '--max-tokens', '24', '--json');
    ($rc, $out, $err) = run($cli_bin, @r8, '--tenant', 'acme');
    my $a = eval { JSON::PP->new->decode($out) } // {};
    is($rc, 0, 'int8 engine: a long prompt') or diag($err);
    is($a->{cache}, 'miss', '  miss');
    ($rc, $out) = run($cli_bin, @r8, '--tenant', 'acme');
    my $b = eval { JSON::PP->new->decode($out) } // {};
    ok($b->{cache} eq 'hit' && $b->{usage}{prompt_tokens_details}{cached_tokens} > 0,
       "  again: a hit ($b->{usage}{prompt_tokens_details}{cached_tokens} cached tokens)");
    ok(@{ $a->{choices}[0]{token_ids} // [] } == 24, '  24 tokens');
    is_deeply($b->{choices}[0]{token_ids}, $a->{choices}[0]{token_ids}, '  the hit answers the miss\'s tokens');
    is($e8->stop, 0, 'int8 engine: SIGTERM exits 0');
    my $e8all = Kvgate::Engine->start(socket => $s8, extra => [ '--kv-dtype', 'int8',
                                                                '--kv-full-precision-layers', '5' ]);
    like($e8all->log, qr/--kv-full-precision-layers 5: all 5 layers keep float32/,
         '--kv-full-precision-layers 5 of 5: every layer float32, said');
    ($rc, $out) = run($cli_bin, '--socket', $s8, '--prompt', $c0->{prompt}, '--temperature', '0',
                      '--max-tokens', $ng, '--json');
    my $j = eval { JSON::PP->new->decode($out) } // {};
    is_deeply($j->{choices}[0]{token_ids}, $c0->{greedy_ids}, '  the float32 answer (the reference ids)');
    is($e8all->stop, 0, '  SIGTERM exits 0');
}

is($e->stop, 0, 'SIGTERM: the engine exits 0');
ok(!-e $sock, '  and removes its socket');
unlike($e->log, qr/AddressSanitizer|runtime error|LeakSanitizer/, 'engine log has no sanitizer reports');

done_testing;
