#!/usr/bin/env perl
# Anthropic's cache_control as kvgate keeps it (/v1/messages): the prefix up to a marked
# block is held (pinned in the engine's pool, never evicted) for its TTL, within the
# operator's kvgate_cache_ttl_max (8 s here: the storm fits well inside it, and the test outlives it) and the pool's
# pinned share; usage says what was written and read:
#   - first request: cache_creation_input_tokens = the system block's full blocks, now
#     held; cache_read 0; input_tokens the rest;
#   - an eviction storm (prompts that need most of the pool) drops another request's
#     unmarked prefix, and the marked one survives: a second request with the same
#     system block reads it (cache_read = those tokens, creation 0);
#   - past the TTL the hold has ended: the next storm evicts it, and the next request
#     writes it again (creation again, read 0).
# The engine: stories260K on the CPU, a 39-block pool. The waits past the TTL are sleeps
# (nothing the server writes is awaited); every other outcome is exact.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Kvgate::Engine;
use Kvgate::Gateway;

my $g = Kvgate::Gateway->new(engine => [ '--kv-memory', '800K' ],
                             http => 'kvgate_cache_ttl_max 8s;');

my @cases = @{ JSON::PP->new->decode(do {
    open my $fh, '<', Kvgate::Engine::shared_dir() . '/models/stories260K/golden-greedy.json' or die $!;
    local $/; <$fh>
})->{cases} };
my $system = $cases[0]{full_text};

sub marked {
    my ($question) = @_;
    my $r = $g->post('/v1/messages', {
        model => 'stories260K', max_tokens => 8, temperature => 0,
        system => [ { type => 'text', text => $system, cache_control => { type => 'ephemeral', ttl => '5m' } } ],
        messages => [ { role => 'user', content => $question } ] }, 'X-Tenant-Id' => 'acme');
    is($r->{status}, 200, "marked request ($question): 200");
    return $r->{json}{usage} // {};
}

sub plain {
    my ($k, $tenant) = @_;
    my $r = $g->post('/v1/messages', {
        model => 'stories260K', max_tokens => 8, temperature => 0,
        messages => [ { role => 'user', content => $cases[$k]{full_text} } ] }, 'X-Tenant-Id' => $tenant // 'acme');
    return $r->{json}{usage} // {};
}

sub storm {
    for my $k (2, 3, 4) {
        plain($k, 'storm');
    }
}

my $u1 = marked('Who is Lily?');
my $pt = ($u1->{input_tokens} // 0) + ($u1->{cache_creation_input_tokens} // 0) + ($u1->{cache_read_input_tokens} // 0);
my $w = $u1->{cache_creation_input_tokens} // 0;
ok($w >= 128 && $w % 16 == 0, "first: cache_creation_input_tokens $w (the system block's full blocks)");
is($u1->{cache_read_input_tokens}, 0, '  cache_read_input_tokens 0');
is($u1->{input_tokens}, $pt - $w, "  input_tokens the rest ($pt - $w)");

my $p1 = plain(1);
is($p1->{cache_creation_input_tokens}, 0, 'an unmarked request: cache_creation_input_tokens 0');
is(plain(1)->{cache_read_input_tokens}, int((($p1->{input_tokens} // 0) - 1) / 16) * 16,
   '  asked again at once: its prefix is read');

storm();

is(plain(1)->{cache_read_input_tokens}, 0, 'after the storm the unmarked prefix is gone');
my $u2 = marked('Where does Lily live?');
is($u2->{cache_read_input_tokens}, $w, "the marked prefix survived: cache_read_input_tokens $w");
is($u2->{cache_creation_input_tokens}, 0, '  cache_creation_input_tokens 0');
my $pt2 = ($u2->{input_tokens} // 0) + $w;
ok($u2->{input_tokens} > 0 && $pt2 > $w, "  input_tokens the rest ($u2->{input_tokens})");

my $m = $g->wait_metrics(sub { $g->engine_metric($_[0], 'kvgate_kv_blocks', 'state="pinned"') > 0 },
                         'the held blocks in /metrics');
is($g->engine_metric($m, 'kvgate_kv_blocks', 'state="pinned"'), $w / 16, 'kvgate_kv_blocks{state="pinned"}: the held blocks');

# (past kvgate_cache_ttl_max from the last marked request: its hold has ended)
sleep 8.5;
storm();
my $u3 = marked('Who is Lily?');
is($u3->{cache_read_input_tokens}, 0, 'past the TTL, after a storm: the prefix is gone (cache_read 0)');
is($u3->{cache_creation_input_tokens}, $w, "  and written again (cache_creation_input_tokens $w)");

$g->stop;
done_testing();
