#!/usr/bin/env perl
# The KV disk tier through the engine (--kv-disk DIR --kv-disk-size SIZE), stories260K on a
# pool of 19 blocks:
#   - bad flags are startup errors naming the flag;
#   - a prompt whose blocks two later prompts evicted from the pool hits again, every
#     cached block read back from disk, with token ids and log-probs identical to its
#     first (computed) answer; another tenant misses the same text;
#   - after a restart on the same DIR the first request hits, identically; a new
#     tenant misses;
#   - expiry: blocks of an engine with --cache-ttl 1 are gone for an engine started on
#     their DIR more than a second after it stopped (the expiry is wall-clock time in
#     the slot header);
#   - an engine of another model on DIR finds nothing; corrupt slots (a flipped byte in
#     every payload) are dropped and recomputed, identically; a wiped tenant misses;
#   - int8 KV (--kv-dtype int8): evicted to disk and back, and after a restart, with the
#     answers of its first (computed) run; an engine of float32 KV or of another
#     --kv-full-precision-layers on its DIR finds nothing.
# No timing (the expiry case only waits for a second to pass): what a running engine wrote is read after it stops (a clean stop writes
# its queue out), or as a hit served from disk or from the writer's queue alike.
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
my $dir = tempdir('kvgate-kvdisk-XXXXXX', TMPDIR => 1, CLEANUP => 1);
my $sock = "$dir/engine.sock";
my $kv = "$dir/kv";

sub slurp { my ($f) = @_; open my $fh, '<:raw', $f or die "$f: $!"; local $/; my $s = <$fh>; $s // '' }
sub run { return Kvgate::Engine::run_cmd(@_) }

# ---- usage and startup errors ----------------------------------------------------------

my @model = (Kvgate::Engine::stories_args(), '--chat-template', 'plain');
{
    my ($rc, undef, $err) = run($engine_bin, @model, '--socket', $sock, '--kv-disk', $kv);
    is($rc, 2, '--kv-disk without --kv-disk-size: exit 2');
    like($err, qr/--kv-disk needs --kv-disk-size/, '  says so');
    ($rc, undef, $err) = run($engine_bin, @model, '--socket', $sock, '--kv-disk', $kv, '--kv-disk-size', 'big');
    is($rc, 2, 'a bad --kv-disk-size: exit 2');
    like($err, qr/--kv-disk-size: 'big' is not a size/, '  names the option and value');
    open my $fh, '>', "$dir/afile" or die;
    close $fh;
    ($rc, undef, $err) = run($engine_bin, @model, '--socket', $sock, '--kv-disk', "$dir/afile", '--kv-disk-size', '1M');
    is($rc, 1, '--kv-disk naming a file: exit 1');
    like($err, qr/--kv-disk \Q$dir\E\/afile: not a directory/, '  names the flag and the path');
    ($rc, undef, $err) = run($engine_bin, @model, '--socket', $sock, '--kv-disk', $kv, '--kv-disk-size', '8K');
    is($rc, 1, 'a --kv-disk-size without room for a block: exit 1');
    like($err, qr/--kv-disk .*hold no block/, '  says so');
}

# ---- evicted to disk and back ----------------------------------------------------------

my $golden = JSON::PP->new->decode(slurp("$shared/models/stories260K/golden-greedy.json"));
my @cases = @{ $golden->{cases} };
my %file;
for my $k (0 .. 2) {
    my ($fh, $f) = tempfile(DIR => $dir);
    print $fh $cases[$k]{full_text};
    close $fh;
    $file{$k} = $f;
}
my @disk = ('--kv-memory', '400K', '--kv-disk', $kv, '--kv-disk-size', '4M');
my $e = Kvgate::Engine->start(socket => $sock, extra => \@disk);
my ($pool) = $e->ready_line =~ /KV pool (\d+) blocks/;
is($pool, 19, 'the pool holds 19 blocks');

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
    is_deeply($got->{ids}, $want->{ids}, "$name: the same token ids");
    is($got->{logprobs}, $want->{logprobs}, '  and the same log-probs, to the bit');
}

my $first = ask(0, 'acme');
is($first->{cached}, 0, 'tenant acme, prompt A: a miss');
ok(@{ $first->{ids} // [] } == 24, '  24 tokens');
# every full block before the one holding the last prompt token
my $full = int(($first->{prompt} - 1) / 16) * 16;
ok($full >= 160, "  $first->{prompt} prompt tokens, $full of them in full blocks");
is(ask(1, 'acme')->{cached}, 0, 'prompt B: a miss (evicts most of A from the pool)');
is(ask(2, 'acme')->{cached}, 0, 'prompt C: a miss (evicts the rest of A)');
my $again = ask(0, 'acme');
is($again->{cached}, $full, "prompt A again: $full cached tokens, from disk");
same_answer($again, $first, '  as computed');
is(ask(0, 'other')->{cached}, 0, 'tenant other, the same text: a miss');
is($e->stop, 0, 'the engine stops cleanly');
my $log = $e->log;
my ($written, $read) = $log =~ /KV disk: (\d+) blocks written .*?, (\d+) read back/;
ok(($written // 0) > 0, "  it had written blocks to disk (" . ($written // 'none') . ')');
ok(($read // 0) >= $full / 16, "  and read A's back (" . ($read // 'none') . ')');

# ---- restart ---------------------------------------------------------------------------

unlink "$sock.log";
$e->restart;
like($e->log, qr/KV disk \Q$kv\E\/kvgate-kv\.slots: \d+ slots of \d+ bytes .*, [1-9]\d* blocks found/,
     'restarted on the same directory: it finds blocks');
my $warm = ask(0, 'acme');
is($warm->{cached}, $full, "the first request after the restart: $full cached tokens");
same_answer($warm, $first, '  as computed before the restart');
is(ask(0, 'newcomer')->{cached}, 0, "a new tenant misses acme's blocks found on disk");
is($e->stop, 0, 'stops cleanly');

# ---- expiry across a restart -----------------------------------------------------------

{
    my $kvt = "$dir/kvttl";
    my @ttl = ('--kv-memory', '400K', '--kv-disk', $kvt, '--kv-disk-size', '4M', '--cache-ttl', '1');
    unlink "$sock.log";
    my $t = Kvgate::Engine->start(socket => $sock, extra => \@ttl);
    is(ask(0, 'acme')->{cached}, 0, '--cache-ttl 1: prompt A, a miss');
    is($t->stop, 0, '  stopped cleanly (its blocks, if still live, written with 1 s to live)');
    # every block expires at most 1 s after its last use, before the stop
    select(undef, undef, undef, 1.5);
    unlink "$sock.log";
    $t->restart;
    like($t->log, qr/KV disk .*, 0 blocks found/, '  1.5 s later an engine on its directory finds none');
    is(ask(0, 'acme')->{cached}, 0, '  prompt A: a miss');
    is($t->stop, 0, '  stops cleanly');
}

# ---- another model on the directory ----------------------------------------------------

unlink "$sock.log";
my $o = Kvgate::Engine->start(socket => $sock, args => ['--model', 'synthetic:260K'], extra => \@disk);
like($o->log, qr/KV disk .*, 0 blocks found/, 'another model on the directory finds nothing');
is($o->stop, 0, '  and stops cleanly');

# ---- corrupt slots ---------------------------------------------------------------------

unlink "$sock.log";
$e->restart;
is($e->stop, 0, 'an engine that only starts and stops');
my ($slot) = $e->log =~ /slots of (\d+) bytes/;
{
    my $f = "$kv/kvgate-kv.slots";
    my $size = -s $f;
    open my $fh, '+<:raw', $f or die "$f: $!";
    for (my $off = 0; $off + $slot <= $size; $off += $slot) {
        my $c;
        sysseek($fh, $off + 4096 + 100, 0);
        sysread($fh, $c, 1);
        sysseek($fh, $off + 4096 + 100, 0);
        syswrite($fh, chr(ord($c) ^ 0x20));
    }
    close $fh;
}
unlink "$sock.log";
$e->restart;
my $bad = ask(0, 'acme');
is($bad->{cached}, 0, 'every payload corrupted: the blocks are not used');
same_answer($bad, $first, '  recomputed');
is($e->stop, 0, 'stops cleanly');
like($e->log, qr/a corrupt block in .*dropped, recomputed/, '  the corruption was logged');

# ---- wipe a tenant ---------------------------------------------------------------------

unlink "$sock.log";
$e->restart;
is(ask(0, 'acme')->{cached}, $full, 'restarted: acme hits again (the recomputed blocks replaced the corrupt ones)');
is($e->stop, 0, 'stops cleanly');
{
    my ($rc, $out, $err) = run($engine_bin, @model, @disk, '--kv-disk-wipe-tenant', 'acme');
    is($rc, 0, '--kv-disk-wipe-tenant acme: exit 0') or diag($err);
    like($out, qr/--kv-disk-wipe-tenant acme: ([1-9]\d*) blocks dropped/, '  blocks dropped');
}
unlink "$sock.log";
$e->restart;
my $wiped = ask(0, 'acme');
is($wiped->{cached}, 0, 'after the wipe acme misses');
same_answer($wiped, $first, '  recomputed');
is($e->stop, 0, 'stops cleanly');

# ---- int8 KV: blocks of its own dtype ----------------------------------------------------

my $kv8 = "$dir/kv8";
my @disk8 = ('--kv-memory', '300K', '--kv-disk', $kv8, '--kv-disk-size', '4M');
unlink "$sock.log";
my $i8 = Kvgate::Engine->start(socket => $sock, extra => [ @disk8, '--kv-dtype', 'int8' ]);
($pool) = $i8->ready_line =~ /KV pool (\d+) blocks/;
is($pool, 19, 'int8 KV: 19 blocks in 300K (15,424 bytes a block)');
my $first8 = ask(0, 'acme');
is($first8->{cached}, 0, 'int8 KV, prompt A: a miss');
ask(1, 'acme');
ask(2, 'acme');
my $again8 = ask(0, 'acme');
is($again8->{cached}, $full, "prompt A again after B and C: $full cached tokens");
same_answer($again8, $first8, '  as computed');
is($i8->stop, 0, 'stops cleanly');
unlink "$sock.log";
$i8->restart;
like($i8->log, qr/KV disk .*, [1-9]\d* blocks found/, 'restarted with --kv-dtype int8: it finds its blocks');
my $warm8 = ask(0, 'acme');
is($warm8->{cached}, $full, "  the first request: $full cached tokens");
same_answer($warm8, $first8, '  as computed before the restart');
is($i8->stop, 0, 'stops cleanly');
for my $other ([ 'float32 KV', [] ], [ '--kv-full-precision-layers 2', [ '--kv-dtype', 'int8', '--kv-full-precision-layers', '2' ] ]) {
    unlink "$sock.log";
    my $o8 = Kvgate::Engine->start(socket => $sock, extra => [ @disk8, @{ $other->[1] } ]);
    like($o8->log, qr/KV disk .*, 0 blocks found/, "an engine of $other->[0] on the int8 engine's directory finds nothing");
    is(ask(0, 'acme')->{cached}, 0, '  a miss');
    is($o8->stop, 0, '  stops cleanly');
}

done_testing();
