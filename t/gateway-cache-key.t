#!/usr/bin/env perl
# OpenAI's prompt caching fields over three engines (prefix routing):
#   - prompt_cache_key: six different prompts with one key go to one engine; keys group
#     per tenant (the same key under another tenant may go elsewhere) and spread the
#     keys over the engines; the key never widens the cache: another tenant with the
#     same key and prompt misses;
#   - prompt_cache_retention: "24h" keeps the blocks for kvgate_cache_ttl_max (30 s
#     here) where the location's kvgate_cache_ttl is 1 s: a hit 2.5 s later, where
#     "in_memory" (the default) has expired; bad values are 400 with OpenAI's error.
# Which engine served a request is read from the access log ($kvgate_engine); every
# read of the log waits with a deadline.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Kvgate::Engine;
use Kvgate::Gateway;

my $g = Kvgate::Gateway->new(
    engines => [ { name => 'a' }, { name => 'b' }, { name => 'c' } ],
    group => 'route prefix;',
    locations => 'location /ret/v1/ { kvgate_pass pool; kvgate_cache_ttl 1s; kvgate_cache_ttl_max 30s; }');

my $doc = join ' ', ('Once upon a time there was a little girl named Lily who liked to play.') x 12;

sub ask {
    my ($tenant, $prompt, %extra) = @_;
    my $path = delete $extra{path} // '/v1/completions';
    return $g->post($path, { model => 'stories260K', prompt => $prompt, max_tokens => 2, temperature => 0,
                             %extra }, 'X-Tenant-Id' => $tenant);
}

# The engines of the tenant's requests, in order, once n of them are logged.
sub engines_of {
    my ($tenant, $n) = @_;
    my $re = qr/^200 t=\Q$tenant\E .* e=(\w+)$/;
    $g->t->wait_for(sub {
        open my $fh, '<', $g->t->prefix . '/logs/kvgate.log' or return 0;
        my $c = grep { $_ =~ $re } <$fh>;
        return $c >= $n;
    }, "$n log lines of tenant $tenant");
    open my $fh, '<', $g->t->prefix . '/logs/kvgate.log' or return ();
    return map { /$re/ ? $1 : () } <$fh>;
}

# ---- prompt_cache_key ----------------------------------------------------------------

for my $i (1 .. 6) {
    my $r = ask('acme', "$doc Story number $i begins here.", prompt_cache_key => 'team-1');
    is($r->{status}, 200, "prompt $i with prompt_cache_key team-1: 200");
}
my @e = engines_of('acme', 6);
is(scalar @e, 6, 'six requests logged');
is(scalar(keys %{ { map { $_ => 1 } @e } }), 1, "  all on one engine ($e[0]), six different prompts");

# keys spread: one request per key, ten keys, under another tenant
for my $k (1 .. 10) {
    ask('spread', "$doc Key $k.", prompt_cache_key => "key-$k");
}
my %seen = map { $_ => 1 } engines_of('spread', 10);
cmp_ok(scalar(keys %seen), '>=', 2, 'ten keys over ' . scalar(keys %seen) . ' engines (' . join(',', sort keys %seen) . ')');

# the key is an affinity, not a cache scope: another tenant, same key, same prompt
{
    my $p = "$doc Story number 1 begins here.";
    my $r = ask('acme', $p, prompt_cache_key => 'team-1');
    is($r->{headers}{'x-kvgate-cache'}, 'hit', 'acme asks prompt 1 again: hit');
    $r = ask('intruder', $p, prompt_cache_key => 'team-1');
    is($r->{status}, 200, 'another tenant, the same key and prompt: 200');
    is($r->{headers}{'x-kvgate-cache'}, 'miss', '  a miss (the key never widens the cache beyond the tenant)');
}

# bad values
{
    my $r = ask('acme', 'hi', prompt_cache_key => 42);
    is($r->{status}, 400, 'prompt_cache_key 42: 400');
    is($r->{json}{error}{param}, 'prompt_cache_key', '  param prompt_cache_key');
    $r = ask('acme', 'hi', prompt_cache_key => 'x' x 1025);
    is($r->{status}, 400, 'a 1,025-byte prompt_cache_key: 400');
    $r = ask('acme', 'hi', prompt_cache_retention => '7d');
    is($r->{status}, 400, 'prompt_cache_retention "7d": 400');
    like($r->{json}{error}{message} // '', qr/'in_memory' and '24h'/, '  names the accepted values');
    $r = $g->post('/v1/chat/completions', { model => 'stories260K', max_tokens => 2,
                                            messages => [ { role => 'user', content => 'hi' } ],
                                            prompt_cache_key => 'k', prompt_cache_retention => 'in_memory' },
                  'X-Tenant-Id' => 'acme');
    isnt($r->{status}, 400, 'chat accepts both fields (' . $r->{status} . ')');
}

# ---- prompt_cache_retention ----------------------------------------------------------

{
    # (different from their first token: blocks a "24h" request touched would be kept)
    my $short = "Retention in memory. $doc";
    my $long = "Retention for a day. $doc";
    ask('ret', $short, path => '/ret/v1/completions');
    ask('ret', $long, path => '/ret/v1/completions', prompt_cache_retention => '24h');
    # (the sleep lets the 1 s TTL pass; every lookup first drops what expired, so it
    # waits for nothing the server writes)
    sleep 2.5;
    my $r = ask('ret', $short, path => '/ret/v1/completions');
    is($r->{headers}{'x-kvgate-cache'}, 'miss', 'in_memory: kvgate_cache_ttl 1s, a miss 2.5 s later');
    $r = ask('ret', $long, path => '/ret/v1/completions', prompt_cache_retention => '24h');
    is($r->{headers}{'x-kvgate-cache'}, 'hit', '"24h": kept for kvgate_cache_ttl_max 30s, a hit 2.5 s later');
}

$g->stop;
done_testing();
