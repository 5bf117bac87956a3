#!/usr/bin/env perl
# The KV host tier (--kv-host-memory SIZE) through the engine on the CUDA backend, emulated
# (build/emu/bin/kvgate-engine: the backend's host code and kernels, the emulator's stream
# model, which runs queued copies late: a copy the stream does not order shows up as wrong
# bytes), stories260K on a pool of a few blocks:
#   - bad flags: a bad size (exit 2); the CPU backend refuses the tier (its pool is host
#     memory), naming the flag;
#   - a prompt whose blocks two later prompts evicted from the device pool hits again,
#     every cached block copied back from pinned host memory, with token ids and log-probs
#     identical to its first (computed) answer; another tenant misses the same text;
#   - host and disk together, the host tier too small for the working set: blocks go on
#     from host memory to the disk; the prompt hits again (host and disk blocks), the same
#     answer; a clean stop writes the host tier's blocks to disk; after a restart the first
#     request hits, the same answer;
#   - the same with int8 KV (--kv-dtype int8) on the same DIR: the BF16 blocks there are not
#     read (another dtype), the int8 ones come back with the answer int8 computed.
# No timing: what a running engine did is read from its log after it stops.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Temp qw(tempdir tempfile);
use JSON::PP;
use Test::More;
use Kvgate::Engine;

my $build = $ENV{BUILD} || 'build';
$build = "$FindBin::Bin/../$build" unless $build =~ m{^/};
my $emu_engine = "$build/emu/bin/kvgate-engine";
plan skip_all => "no emulated engine ($emu_engine: make emu)" unless -x $emu_engine;
# The emulated engine has no ASan build; the tier's code runs under ASan in build/asan/t/kv_host.
plan skip_all => 'the ASan pass: the host tier is checked by build/asan/t/kv_host' if Kvgate::Engine::asan();

my $cpu_engine = Kvgate::Engine::bin('kvgate-engine');
my $cli_bin = Kvgate::Engine::bin('kvgate-cli');
my $shared = Kvgate::Engine::shared_dir();
my $dir = tempdir('kvgate-kvhost-XXXXXX', TMPDIR => 1, CLEANUP => 1);
my $sock = "$dir/engine.sock";
my $kv = "$dir/kv";
mkdir $kv or die "$kv: $!";

sub slurp { my ($f) = @_; open my $fh, '<:raw', $f or die "$f: $!"; local $/; my $s = <$fh>; $s // '' }
sub run { return Kvgate::Engine::run_cmd(@_) }

# The host tier's summary at an engine's stop: (blocks in, copied back, on to disk), the
# last one in the log.
sub host_summary {
    my ($log) = @_;
    my @all = $log =~ /KV host memory: (\d+) blocks in .*?, (\d+) copied back .*?\((\d+) to disk\)/g;
    return @all ? @all[-3 .. -1] : ();
}

# ---- flags -----------------------------------------------------------------------------

my @model = (Kvgate::Engine::stories_args(), '--chat-template', 'plain');
{
    my ($rc, undef, $err) = run($emu_engine, @model, '--socket', $sock, '--backend', 'cuda',
                                '--kv-host-memory', 'lots');
    is($rc, 2, 'a bad --kv-host-memory: exit 2');
    like($err, qr/--kv-host-memory: 'lots' is not a size/, '  names the option and value');
    ($rc, undef, $err) = run($cpu_engine, @model, '--socket', $sock, '--kv-host-memory', '1M');
    is($rc, 1, '--kv-host-memory on the CPU backend: exit 1');
    like($err, qr/--kv-host-memory: the cpu backend's KV pool is in host memory already/, '  says why');
}

# ---- evicted to host memory and back -----------------------------------------------------

my $golden = JSON::PP->new->decode(slurp("$shared/models/stories260K/golden-greedy.json"));
my @cases = @{ $golden->{cases} };
my %file;
for my $k (0 .. 2) {
    my ($fh, $f) = tempfile(DIR => $dir);
    print $fh $cases[$k]{full_text};
    close $fh;
    $file{$k} = $f;
}

sub ask {
    my ($k, $tenant) = @_;
    my ($rc, $out, $err) = run($cli_bin, '--socket', $sock, '--prompt-file', $file{$k}, '--tenant', $tenant,
                               '--temperature', '0', '--max-tokens', '24', '--cache-min-tokens', '16', '--json');
    diag($err) if $rc;
    my $j = eval { JSON::PP->new->decode($out) } // {};
    return {
        ids => $j->{choices}[0]{token_ids},
        logprobs => join(',', @{ $j->{choices}[0]{logprobs} // [] }),
        prompt => $j->{usage}{prompt_tokens} // -1,
        cached => $j->{usage}{prompt_tokens_details}{cached_tokens} // -1,
    };
}

sub same_answer {
    my ($got, $want, $name) = @_;
    ok(@{ $got->{ids} // [] } == 24, "$name: 24 tokens");
    is_deeply($got->{ids}, $want->{ids}, "  the same token ids");
    is($got->{logprobs}, $want->{logprobs}, '  and the same log-probs, to the bit');
}

# A device block of stories260K is 5 layers x 4 kv heads x (K, V) x 16 positions x 8 BF16s:
# 10,240 bytes.
my @cuda = ('--backend', 'cuda', '--kv-memory', '200K');
my $e = Kvgate::Engine->start(socket => $sock, bin => $emu_engine, extra => [ @cuda, '--kv-host-memory', '2M' ]);
my ($pool) = $e->ready_line =~ /KV pool (\d+) blocks/;
is($pool, 20, 'the device pool holds 20 blocks');
like($e->log, qr/KV host memory: 204 blocks of 10240 bytes/, 'the host tier: 204 blocks of 10,240 bytes');

my $first = ask(0, 'acme');
is($first->{cached}, 0, 'tenant acme, prompt A: a miss');
ok(@{ $first->{ids} // [] } == 24, '  24 tokens');
my $full = int(($first->{prompt} - 1) / 16) * 16;
ok($full >= 160, "  $first->{prompt} prompt tokens, $full of them in full blocks");
is(ask(1, 'acme')->{cached}, 0, 'prompt B: a miss (evicts most of A from the pool)');
is(ask(2, 'acme')->{cached}, 0, 'prompt C: a miss (evicts the rest of A)');
my $again = ask(0, 'acme');
is($again->{cached}, $full, "prompt A again: $full cached tokens, from host memory");
same_answer($again, $first, '  as computed');
is(ask(0, 'other')->{cached}, 0, 'tenant other, the same text: a miss');
is($e->stop, 0, 'the engine stops cleanly');
my ($in, $back, $to_disk) = host_summary($e->log);
ok(($in // 0) >= $full / 16, '  blocks went to host memory (' . ($in // 'none') . ')');
ok(($back // 0) >= $full / 16, "  and A's came back (" . ($back // 'none') . ')');
unlike($e->log, qr/kvg-emu:|AddressSanitizer|runtime error/, '  no emulator report');

# ---- host memory, then disk --------------------------------------------------------------

# 8 host blocks: most of A's go on to the disk.
my @tiers = (@cuda, '--kv-host-memory', '80K', '--kv-disk', $kv, '--kv-disk-size', '4M');
$e = Kvgate::Engine->start(socket => $sock, bin => $emu_engine, extra => \@tiers);
like($e->log, qr/KV host memory: 8 blocks/, 'host and disk: 8 host blocks');
my $a1 = ask(0, 'acme');
is($a1->{cached}, 0, 'prompt A: a miss');
same_answer($a1, $first, '  the answer of the engine without tiers');
ask(1, 'acme');
ask(2, 'acme');
my $a2 = ask(0, 'acme');
is($a2->{cached}, $full, "prompt A again: $full cached tokens, from host memory and disk");
same_answer($a2, $first, '  as computed');
is($e->stop, 0, 'the engine stops cleanly');
my $log = $e->log;
($in, $back, $to_disk) = host_summary($log);
ok(($to_disk // 0) > 0, '  host blocks went on to disk (' . ($to_disk // 'none') . ')');
my ($read) = ($log =~ /KV disk: \d+ blocks written .*?, (\d+) read back/g)[-1];
ok(($read // 0) > 0, '  and some of A came back from disk (' . ($read // 'none') . ')');

$e = Kvgate::Engine->start(socket => $sock, bin => $emu_engine, extra => \@tiers);
my $a3 = ask(0, 'acme');
is($a3->{cached}, $full, "after a restart, prompt A: $full cached tokens");
same_answer($a3, $first, '  as computed');
is($e->stop, 0, 'the engine stops cleanly');
unlike($e->log, qr/kvg-emu:|AddressSanitizer|runtime error/, '  no emulator report');

# ---- int8 KV (--kv-dtype int8) through both tiers ---------------------------------------

# The same DIR holds the BF16 engine's blocks: the int8 pool's dtype (INT8_CUDA + 3) is
# another, so none of them is read; its own blocks come back from host memory and disk, and
# after a restart, with the answer it computed.
my @tiers8 = (@tiers, '--kv-dtype', 'int8');
$e = Kvgate::Engine->start(socket => $sock, bin => $emu_engine, extra => \@tiers8);
like($e->log, qr/KV int8: layers 0\.\.2 BF16, 3\.\.4 int8: 9216 bytes a block \(BF16: 10240\)/,
     'int8 KV on CUDA: 9,216-byte blocks (BF16: 10,240)');
my $i1 = ask(0, 'acme');
is($i1->{cached}, 0, 'int8, prompt A: a miss (the BF16 blocks on disk are not this layout)');
ask(1, 'acme');
ask(2, 'acme');
my $i2 = ask(0, 'acme');
is($i2->{cached}, $full, "int8, prompt A again: $full cached tokens, from host memory and disk");
same_answer($i2, $i1, '  as computed with int8 KV');
is($e->stop, 0, 'the engine stops cleanly');
($in, $back, $to_disk) = host_summary($e->log);
ok(($to_disk // 0) > 0, '  int8 host blocks went on to disk (' . ($to_disk // 'none') . ')');
$e = Kvgate::Engine->start(socket => $sock, bin => $emu_engine, extra => \@tiers8);
my $i3 = ask(0, 'acme');
is($i3->{cached}, $full, "int8, after a restart, prompt A: $full cached tokens");
same_answer($i3, $i1, '  as computed');
is($e->stop, 0, 'the engine stops cleanly');
unlike($e->log, qr/kvg-emu:|AddressSanitizer|runtime error/, '  no emulator report');

done_testing;
