#!/usr/bin/perl
# The prefix cache through the gateway: the second request of a >= 128-token prompt is
# a 'hit' with cached tokens and the same answer; a short prompt is 'bypass'; another
# tenant gets 0; a second chat turn repeating the first turn and its answer is served
# mostly from the cache; whitespace-only differences hit with normalization on and miss
# with it off; kvgate_cache_ttl expires blocks; the metrics reflect the traffic;
# $kvgate_route_key routes prompts sharing a prefix to the same node of a two-node tier.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);
use Kvgate::Gateway;

my $g = Kvgate::Gateway->new(locations => <<'EOF', server => '', http => <<'EOF2');
        location /norm/v1/ {
            kvgate_pass;
            kvgate_normalize spaces trailing blank-lines;
        }
        location /short-ttl/v1/ {
            kvgate_pass;
            kvgate_cache_ttl 2s;
        }
EOF
    upstream nodes {
        hash $kvgate_route_key consistent;
        server 127.0.0.1:%%PORT_1%%;
        server 127.0.0.1:%%PORT_2%%;
    }
    server {
        listen 127.0.0.1:%%PORT_1%%;
        location /v1/ { kvgate_pass; add_header X-Node 1 always; }
    }
    server {
        listen 127.0.0.1:%%PORT_2%%;
        location /v1/ { kvgate_pass; add_header X-Node 2 always; }
    }
    server {
        listen 127.0.0.1:%%PORT_3%%;
        access_log %%PREFIX%%/logs/front.log kvgate;
        location / { proxy_pass http://nodes; }
    }
EOF2

my $doc = join ' ', map { $_->{full_text} } @{ JSON::PP->new->decode(do {
    open my $fh, '<', Kvgate::Engine::shared_dir() . '/models/stories260K/golden-greedy.json' or die $!;
    local $/; <$fh>
})->{cases} }[0 .. 1];
$doc = substr($doc, 0, 900);

# ---- hit, miss, bypass, tenants ------------------------------------------------------------

my $req = { prompt => "$doc\nQuestion: who is in the story?", max_tokens => 12, temperature => 0.7, seed => 5, n => 2 };
my $first = $g->completion($req, 'X-Tenant-Id' => 'acme');
my $second = $g->completion($req, 'X-Tenant-Id' => 'acme');
my $pt = $first->{json}{usage}{prompt_tokens};
ok($pt >= 128, "a $pt-token prompt");
is($first->{headers}{'x-kvgate-cache'}, 'miss', 'first request: X-KVGate-Cache miss');
is($first->{json}{usage}{prompt_tokens_details}{cached_tokens}, 0, '  0 cached tokens');
is($first->{headers}{'x-kvgate-bucket'}, '128', '  bucket 128');
is($second->{headers}{'x-kvgate-cache'}, 'hit', 'second request: hit');
my $cached = $second->{json}{usage}{prompt_tokens_details}{cached_tokens};
is($cached, int(($pt - 1) / 16) * 16, "  $cached cached tokens: every full block before the last token");
is_deeply([ map { $_->{text} } @{ $second->{json}{choices} } ], [ map { $_->{text} } @{ $first->{json}{choices} } ],
          '  the same answers, cached or not');

my $other = $g->completion($req, 'X-Tenant-Id' => 'globex');
is($other->{headers}{'x-kvgate-cache'}, 'miss', 'the same prompt under another tenant: miss');
is($other->{json}{usage}{prompt_tokens_details}{cached_tokens}, 0, '  0 cached tokens');
my $default = $g->completion($req);
is($default->{json}{usage}{prompt_tokens_details}{cached_tokens}, 0, 'no tenant header: the default tenant, 0 cached');

my $short = $g->completion({ prompt => 'Once upon a time', max_tokens => 4 }, 'X-Tenant-Id' => 'acme');
is($short->{headers}{'x-kvgate-cache'}, 'bypass', 'a short prompt: bypass');
is($short->{json}{usage}{prompt_tokens_details}{cached_tokens}, 0, '  0 cached');
my $short2 = $g->completion({ prompt => 'Once upon a time', max_tokens => 4 }, 'X-Tenant-Id' => 'acme');
is($short2->{headers}{'x-kvgate-cache'}, 'bypass', '  and again: still bypass (never cached)');

# The tenant comes from the header, never from the body.
my $sneaky = $g->completion({ %$req, user => 'acme', tenant => 'acme', cache_salt => 'acme' }, 'X-Tenant-Id' => 'initech');
is($sneaky->{json}{usage}{prompt_tokens_details}{cached_tokens}, 0,
   'tenant/user/cache_salt fields in the JSON body do not reach the cache key');

# ---- chat: the next turn repeats the history ------------------------------------------------

{
    my @msgs = ({ role => 'system', content => 'You are a storyteller. ' . substr($doc, 0, 600) },
                { role => 'user', content => 'Tell me about Lily.' });
    my $t1 = $g->chat({ messages => \@msgs, max_tokens => 40, temperature => 0 }, 'X-Tenant-Id' => 'chat');
    my $answer = $t1->{json}{choices}[0]{message}{content};
    push @msgs, { role => 'assistant', content => $answer }, { role => 'user', content => 'And then?' };
    my $t2 = $g->chat({ messages => \@msgs, max_tokens => 10, temperature => 0 }, 'X-Tenant-Id' => 'chat');
    my $u = $t2->{json}{usage};
    my $history = $t1->{json}{usage}{prompt_tokens};
    ok($u->{prompt_tokens_details}{cached_tokens} >= $history - 16,
       "second turn: $u->{prompt_tokens_details}{cached_tokens} of $u->{prompt_tokens} prompt tokens cached "
       . "(the first turn's prompt was $history)");
    ok($u->{prompt_tokens_details}{cached_tokens} >= 0.9 * $history, '  covering most of that history');
    isnt($t2->{headers}{'x-kvgate-cache'}, 'miss', "  X-KVGate-Cache: $t2->{headers}{'x-kvgate-cache'}");
}

# ---- normalization ---------------------------------------------------------------------------

{
    my $a = "$doc\nThe end.";
    (my $b = $a) =~ s/ /  /;           # the first space doubled
    $b =~ s/\n/   \n/g;                 # trailing spaces
    $g->post('/norm/v1/completions', { model => 'stories260K', prompt => $a, max_tokens => 2 }, 'X-Tenant-Id' => 'n');
    my $r = $g->post('/norm/v1/completions', { model => 'stories260K', prompt => $b, max_tokens => 2 }, 'X-Tenant-Id' => 'n');
    is($r->{headers}{'x-kvgate-cache'}, 'hit', 'normalization on: a whitespace-only variant hits');
    $g->completion({ prompt => $a, max_tokens => 2 }, 'X-Tenant-Id' => 'n2');
    $r = $g->completion({ prompt => $b, max_tokens => 2 }, 'X-Tenant-Id' => 'n2');
    ok($r->{headers}{'x-kvgate-cache'} eq 'miss' || $r->{headers}{'x-kvgate-cache'} eq 'partial',
       "normalization off: the variant does not hit ($r->{headers}{'x-kvgate-cache'})");
    cmp_ok($r->{json}{usage}{prompt_tokens_details}{cached_tokens}, '<', 64, '  (at most the first blocks match)');
}

# ---- TTL ------------------------------------------------------------------------------------

{
    my $body = { model => 'stories260K', prompt => "$doc TTL", max_tokens => 2 };
    $g->post('/short-ttl/v1/completions', $body, 'X-Tenant-Id' => 'ttl');
    my $r = $g->post('/short-ttl/v1/completions', $body, 'X-Tenant-Id' => 'ttl');
    # (2 s leaves a loaded machine time for the second request to be looked up within
    # the TTL; the sleep lets the TTL pass, and every lookup first drops what expired,
    # so it waits for nothing the server writes)
    is($r->{headers}{'x-kvgate-cache'}, 'hit', 'kvgate_cache_ttl 2s: a hit right away');
    sleep 3.2;
    $r = $g->post('/short-ttl/v1/completions', $body, 'X-Tenant-Id' => 'ttl');
    is($r->{headers}{'x-kvgate-cache'}, 'miss', '  a miss 3 s later (expired)');
}

# ---- metrics ---------------------------------------------------------------------------------

{
    my $series = sub { my ($m, $name) = @_; $g->metric($m, $name) };
    my $engine = sub { my ($m, $name, $labels) = @_; $g->engine_metric($m, $name, $labels) };
    my $elabel = quotemeta $g->engine_label;
    my @want = (
        [ "kvgate_prefix_cache_hit_tokens_total >= $cached",
          sub { $engine->($_[0], 'kvgate_prefix_cache_hit_tokens_total') >= $cached } ],
        [ '  query tokens above hit tokens',
          sub { $engine->($_[0], 'kvgate_prefix_cache_query_tokens_total')
                    > $engine->($_[0], 'kvgate_prefix_cache_hit_tokens_total') } ],
        [ '  kvgate_requests_total by endpoint, bucket and status',
          sub { $series->($_[0], 'kvgate_requests_total{endpoint="completions",bucket="128",status="200"}') >= 4 } ],
        [ '  the bypass bucket',
          sub { $series->($_[0], 'kvgate_requests_total{endpoint="completions",bucket="bypass",status="200"}') >= 2 } ],
        [ '  cached tokens per bucket', sub { $series->($_[0], 'kvgate_cached_tokens_total{bucket="128"}') >= $cached } ],
        [ '  cache lookups by result', sub { $series->($_[0], 'kvgate_cache_lookups_total{result="hit"}') >= 2 } ],
        [ '  cached KV blocks (engine="..." labelled)', sub { $engine->($_[0], 'kvgate_kv_blocks', 'state="cached"') > 0 } ],
        [ '  per-tenant cached blocks', sub { $engine->($_[0], 'kvgate_tenant_cached_blocks', 'tenant="acme"') > 0 } ],
        [ '  the TTFT histogram', sub { $series->($_[0], 'kvgate_time_to_first_token_seconds_count') >= 8 } ],
        [ '  the latency histogram', sub { $_[0] =~ /^kvgate_request_duration_seconds_bucket\{le="\+Inf"\} \d+$/m } ],
        [ '  kvgate_engine_up 1', sub { $series->($_[0], 'kvgate_engine_up') == 1 } ],
        [ '  TTL evictions counted', sub { $_[0] =~ /^kvgate_kv_evictions_total\{engine="$elabel",cause="ttl"\} [1-9]/m } ],
    );
    # The gateway counts a request in its log phase, after the response: wait until the
    # counters have caught up with the traffic above, then check each.
    my $m = $g->wait_metrics(sub { my $m = shift; !grep { !$_->[1]->($m) } @want },
                             'the metrics to count the traffic above');
    ok($_->[1]->($m), $_->[0]) for @want;
    my $s = $g->status;
    is($s->{engine}{model}, 'stories260K', 'kvgate_status: JSON with the engine');
    ok($s->{cache}{hit_rate} > 0, "  hit rate $s->{cache}{hit_rate}");
    ok((grep { $_->{tenant} eq 'acme' } @{ $s->{tenants} }), '  tenants listed');
    # Every request so far reached the engine, whose page is written before each DONE:
    # when the gateway's count equals the engine's, its log phase has counted them all.
    my $settled = sub { $_[0]{gateway}{requests} == $_[0]{scheduler}{completed} };
    my $before = $g->wait_status($settled, 'gateway.requests to equal the engine\'s completed')->{gateway}{requests};
    $g->completion({ prompt => 'x', max_tokens => 1 });
    my $after = $g->wait_status(sub { $_[0]{gateway}{requests} > $before && $settled->($_[0]) },
                                'the request to be counted')->{gateway}{requests};
    is($after, $before + 1, '  one request counted once');
}

# ---- routing by $kvgate_route_key --------------------------------------------------------------

{
    my $front = 3;
    my %node;
    for my $q ('Who is Lily?', 'Who is Tom?', 'What is red?', 'Where is the park?') {
        my $r = $g->t->request('POST', '/v1/completions', port => $g->t->port($front),
            headers => { 'Content-Type' => 'application/json', 'X-Tenant-Id' => 'route' },
            body => JSON::PP->new->encode({ model => 'stories260K', prompt => "$doc\n$q", max_tokens => 2 }));
        $node{ $r->{headers}{'x-node'} // 'none' }++;
    }
    is(scalar keys %node, 1, 'four prompts sharing a long prefix go to one node (' . join(',', keys %node) . ')');
    my %spread;
    for my $i (1 .. 16) {
        my $r = $g->t->request('POST', '/v1/completions', port => $g->t->port($front),
            headers => { 'Content-Type' => 'application/json', 'X-Tenant-Id' => "tenant$i" },
            body => JSON::PP->new->encode({ model => 'stories260K', prompt => "$doc\nQ", max_tokens => 1 }));
        $spread{ $r->{headers}{'x-node'} // 'none' }++;
    }
    is(scalar grep({ /^[12]$/ } keys %spread), 2, '16 tenants with the same prompt spread over both nodes');
    # (the front tier's log line is written after its response)
    my @keys = map { /key=([0-9a-f]{64})/ ? $1 : () }
               $g->t->wait_log('logs/front.log', qr/key=[0-9a-f]{64}/, count => 20);
    ok(@keys >= 20, 'the front tier logs $kvgate_route_key for every request');
    is(scalar(keys %{{ map { $_ => 1 } @keys[0 .. 3] }}), 1, '  one key for the shared prefix');
}

$g->stop;
done_testing;
