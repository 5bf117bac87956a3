#!/usr/bin/perl
# Per-tenant token budgets (kvgate_limit_tokens_zone, kvgate_limit_tokens): a tenant
# whose bucket cannot pay for a prompt is refused before the engine with 429, a
# Retry-After and the API's own error shape (OpenAI's on /v1/completions and
# /v1/chat/completions, streams included; Anthropic's rate_limit_error on
# /v1/messages); another tenant goes on; completion tokens are charged; cached prompt
# tokens cost the configured weight; the counters on /metrics and /status and the
# access-log variables ($kvgate_cache_write_tokens among them); configuration errors
# name the directive; a reload keeps the buckets.
#
# Deterministic: the buckets refill at 1 token a minute, so over the test's seconds
# they refill by less than one token, and each outcome is predicted from the usage the
# earlier answers reported (tokens left = burst - what was charged).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Kvgate::Gateway;

my $g = Kvgate::Gateway->new(
    stall => 'off',   # the engine is stopped (SIGSTOP) below
    http => <<'EOF',
    kvgate_limit_tokens_zone $kvgate_tenant zone=tok:1m;
    kvgate_limit_tokens_zone $kvgate_tenant zone=tokw:1m;
    kvgate_limit_tokens_zone $kvgate_tenant zone=small:32k;
    log_format limit '$status t=$kvgate_tenant p=$kvgate_prompt_tokens c=$kvgate_cached_tokens '
                     'g=$kvgate_completion_tokens w=$kvgate_cache_write_tokens u=$request_uri';
EOF
    server => 'access_log %%PREFIX%%/logs/limit.log limit;',
    locations => <<'EOF');
        location /a/v1/ {
            kvgate_pass;
            kvgate_limit_tokens zone=tok rate=1/m burst=100;
        }
        location /w/v1/ {
            kvgate_pass;
            kvgate_limit_tokens zone=tokw rate=1/m burst=3000 cached=0.1;
        }
        location /r/v1/ {
            kvgate_pass;
            kvgate_limit_tokens zone=small rate=1/m burst=6;
        }
EOF

my $M = 'stories260K';
my $story = [ { role => 'user', content => 'Tell me a story' } ];

sub req {
    my ($path, $body, $tenant) = @_;
    return $g->post($path, { model => $M, temperature => 0, %$body }, 'X-Tenant-Id' => $tenant);
}

# the prompt and completion tokens a 200 reported, in either dialect
sub usage {
    my ($r) = @_;
    my $u = $r->{json}{usage} // {};
    return ($u->{prompt_tokens}, $u->{completion_tokens}) if defined $u->{prompt_tokens};
    return ($u->{input_tokens} + $u->{cache_read_input_tokens} + $u->{cache_creation_input_tokens},
            $u->{output_tokens});
}

sub key_status {
    my ($zone, $key, $cond, $what) = @_;
    my $k;
    $g->wait_status(sub {
        my ($z) = grep { $_->{zone} eq $zone } @{ $_[0]{token_limits} // [] };
        ($k) = grep { $_->{key} eq $key } @{ $z ? $z->{top} : [] };
        $k && $cond->($k);
    }, $what);
    return $k // {};
}

# ---- another tenant first: the prompt sizes of the three endpoints ---------------------------

my %ep = (
    completions => [ '/a/v1/completions', { prompt => 'Once upon a time', max_tokens => 1 } ],
    chat        => [ '/a/v1/chat/completions', { messages => $story, max_tokens => 1 } ],
    messages    => [ '/a/v1/messages', { messages => $story, max_tokens => 1 } ],
);
my (%prompt, $b_left);
$b_left = 100;
for my $e (qw(completions chat messages)) {
    my $r = req(@{ $ep{$e} }, 'bee');
    is($r->{status}, 200, "tenant bee: $e admitted");
    my ($p, $c) = usage($r);
    $prompt{$e} = $p;
    $b_left -= $p + $c;
}
ok($prompt{chat} >= $prompt{completions} && $prompt{messages} >= $prompt{completions},
   "prompts: completions $prompt{completions}, chat $prompt{chat}, messages $prompt{messages}");

# ---- tenant ant spends its budget: each answer predicted -----------------------------------

my ($left, $charged_p, $charged_g, $n_ok) = (100, 0, 0, 0);
my $pc = $prompt{completions};
my $i = 0;
while ($left >= $pc && $i < 20) {
    my $stream = $i % 2;   # completion tokens charged as a stream goes, too
    my $body = { prompt => 'Once upon a time', max_tokens => 30 };
    if ($stream) {
        my ($st, undef, $ev) = $g->stream('/a/v1/completions',
            { temperature => 0, %$body, stream_options => { include_usage => JSON::PP::true } },
            'X-Tenant-Id' => 'ant');
        my ($u) = grep { ref $_ eq 'HASH' && $_->{usage} } @$ev;
        ok($u, "ant: stream $i admitted with $left tokens left") or last;
        $left -= $u->{usage}{prompt_tokens} + $u->{usage}{completion_tokens};
        $charged_p += $u->{usage}{prompt_tokens};
        $charged_g += $u->{usage}{completion_tokens};
    } else {
        my $r = req('/a/v1/completions', $body, 'ant');
        is($r->{status}, 200, "ant: request $i admitted with $left tokens left") or last;
        my ($p, $c) = usage($r);
        $left -= $p + $c;
        $charged_p += $p;
        $charged_g += $c;
    }
    $n_ok++;
    $i++;
}
cmp_ok($left, '<', $pc, "ant: $left tokens left after $n_ok requests, less than a prompt");

sub retry_ok {
    my ($r, $need, $what) = @_;
    my $ra = $r->{headers}{'retry-after'} // '';
    like($ra, qr/^\d+$/, "$what: Retry-After $ra");
    # 1 token a minute: (need - left) minutes, less what refilled since (under one token)
    my $want = ($need - $left) * 60;
    ok($ra =~ /^\d+$/ && $ra <= $want + 1 && $ra > $want - 60, "$what: Retry-After ~ $want s")
        or diag("Retry-After $ra, want about $want");
}

my $r = req('/a/v1/completions', { prompt => 'Once upon a time', max_tokens => 30 }, 'ant');
is($r->{status}, 429, 'ant: completions refused: 429');
is($r->{json}{error}{type}, 'rate_limit_error', '  OpenAI error type rate_limit_error');
is($r->{json}{error}{code}, 'rate_limit_exceeded', '  code rate_limit_exceeded');
like($r->{json}{error}{message}, qr/Rate limit reached for tokens/, '  message');
retry_ok($r, $pc, '  completions');

$r = req('/a/v1/chat/completions', { messages => $story, max_tokens => 4 }, 'ant');
is($r->{status}, 429, 'ant: chat refused: 429');
is($r->{json}{error}{type}, 'rate_limit_error', '  OpenAI error type rate_limit_error');
retry_ok($r, $prompt{chat}, '  chat');

$r = req('/a/v1/chat/completions', { messages => $story, max_tokens => 4, stream => JSON::PP::true }, 'ant');
is($r->{status}, 429, 'ant: a chat stream refused before it starts: 429');
like($r->{headers}{'content-type'} // '', qr{^application/json}, '  as JSON, not a stream');
is($r->{json}{error}{type}, 'rate_limit_error', '  OpenAI error type rate_limit_error');

$r = req('/a/v1/messages', { messages => $story, max_tokens => 4 }, 'ant');
is($r->{status}, 429, 'ant: messages refused: 429');
is($r->{json}{type}, 'error', "  Anthropic's error object");
is($r->{json}{error}{type}, 'rate_limit_error', '  type rate_limit_error');
like($r->{json}{error}{message}, qr/Rate limit reached for tokens/, '  message');
retry_ok($r, $prompt{messages}, '  messages');

# ---- the other tenant is not affected ----------------------------------------------------------

$r = req('/a/v1/completions', { prompt => 'Once upon a time', max_tokens => 1 }, 'bee');
is($r->{status}, 200, "bee: still admitted ($b_left tokens left)");

# ---- the counters -----------------------------------------------------------------------------

my $k = key_status('tok', 'ant', sub { $_[0]{refused} == 4 && $_[0]{requests} == $n_ok
                                       && $_[0]{completion_tokens} == $charged_g },
                   'ant counted');
is($k->{requests}, $n_ok, "status: ant $n_ok requests admitted");
is($k->{refused}, 4, 'status: ant 4 refused');
is($k->{prompt_tokens}, $charged_p, "status: ant $charged_p prompt tokens");
is($k->{completion_tokens}, $charged_g, "status: ant $charged_g completion tokens");
ok(abs($k->{tokens_left} - $left) < 1, "status: ant $k->{tokens_left} tokens left, $left predicted");

my $m = $g->wait_metrics(sub { $g->metric($_[0], 'kvgate_limit_refused_total{zone="tok",key="ant"}') == 4 },
                         'refusals on /metrics');
is($g->metric($m, 'kvgate_limit_refused_total{zone="tok",key="ant"}'), 4, 'metrics: ant refused 4');
is($g->metric($m, 'kvgate_limit_completion_tokens_total{zone="tok",key="ant"}'), $charged_g,
   'metrics: ant completion tokens');
is($g->metric($m, 'kvgate_limit_prompt_tokens_total{zone="tok",key="ant"}'), $charged_p,
   'metrics: ant prompt tokens');
is($g->metric($m, 'kvgate_limit_requests_total{zone="tok",key="bee"}'), 4, 'metrics: bee 4 requests');
is($g->metric($m, 'kvgate_limit_other_refused_total{zone="tok"}'), 0, 'metrics: nothing summed in _other');
is($g->metric($m, 'kvgate_limit_keys{zone="tok"}'), 2, 'metrics: 2 keys in zone tok');

my @lines = $g->t->wait_log('logs/limit.log', qr/^429 t=ant /, count => 4);
is(scalar @lines, 4, 'access log: 4 refusals of ant');
like($lines[0] // '', qr/^429 t=ant p=$pc c=- g=- w=- /, '  with the prompt tokens, nothing else');

# ---- cached prompt tokens at their weight (cached=0.1) -------------------------------------------

my $doc = join ' ', ('Once upon a time there was a little girl named Lily who loved to play outside.') x 12;
my @w;
for my $n (1, 2) {
    my $rw = req('/w/v1/completions', { prompt => $doc, max_tokens => 4 }, 'wes');
    is($rw->{status}, 200, "wes: long prompt $n");
    push @w, { p => $rw->{json}{usage}{prompt_tokens}, g => $rw->{json}{usage}{completion_tokens},
               c => $rw->{json}{usage}{prompt_tokens_details}{cached_tokens} };
}
cmp_ok($w[0]{p}, '>=', 128, "wes: $w[0]{p} prompt tokens, through the cache");
is($w[0]{c}, 0, 'wes: the first one a miss');
cmp_ok($w[1]{c}, '>', 0, "wes: the second one $w[1]{c} cached");
my $cost = $w[0]{p} + $w[0]{g} + ($w[1]{p} - $w[1]{c}) + 0.1 * $w[1]{c} + $w[1]{g};
$k = key_status('tokw', 'wes', sub { $_[0]{requests} == 2 && $_[0]{cached_tokens} == $w[1]{c} },
                'wes counted');
ok(abs($k->{tokens_left} - (3000 - $cost)) < 1,
   "status: wes $k->{tokens_left} tokens left: cached tokens cost 0.1 (" . (3000 - $cost) . ')')
    or diag(explain $k);
is($k->{cached_tokens}, $w[1]{c}, 'status: wes cached tokens');

$r = req('/w/v1/completions', { prompt => 'Once upon a time', max_tokens => 2 }, 'wes');
is($r->{status}, 200, 'wes: a short prompt (bypass)');

@lines = $g->t->wait_log('logs/limit.log', qr/ t=wes /, count => 3);
my ($p0, $p1) = ($w[0]{p}, $w[1]{p});
my ($wr1) = ($w[1]{p} - $w[1]{c});
like($lines[0] // '', qr/^200 t=wes p=$p0 c=0 g=\d+ w=$p0 /, "log: the miss wrote $p0 tokens");
like($lines[1] // '', qr/^200 t=wes p=$p1 c=$w[1]{c} g=\d+ w=$wr1 /, "log: the hit wrote $wr1");
like($lines[2] // '', qr/^200 t=wes p=\d+ c=0 g=2 w=0 /, 'log: a bypass writes nothing');

$m = $g->wait_metrics(sub { $g->metric($_[0], 'kvgate_limit_cached_tokens_total{zone="tokw",key="wes"}')
                            == $w[1]{c} }, 'cached tokens on /metrics');
is($g->metric($m, 'kvgate_limit_cached_tokens_total{zone="tokw",key="wes"}'), $w[1]{c},
   'metrics: wes cached tokens');

SKIP: {
    # the series as Prometheus reads them
    skip 'no promtool', 2 unless -x '/usr/bin/promtool';
    my $f = $g->t->prefix . '/metrics.txt';
    open my $fh, '>', $f or die;
    print $fh $m;
    close $fh;
    my $out = `/usr/bin/promtool check metrics < $f 2>&1`;
    is($?, 0, 'promtool check metrics passes');
    is($out, '', '  and says nothing') or diag($out);
}

# ---- a request the engine never accepted gets its prompt tokens back -----------------------------

{
    $g->engine->signal('STOP');
    my $sock = $g->send_raw('/a/v1/completions', { model => $M, prompt => 'Once upon a time', max_tokens => 30 },
                            'X-Tenant-Id' => 'cat');
    my $kc = key_status('tok', 'cat', sub { $_[0]{requests} == 1 }, 'cat admitted');
    is($kc->{tokens_left}, 100 - $pc, "cat: admitted, its $pc prompt tokens taken");
    close $sock;    # before the (stopped) engine accepted it
    $kc = key_status('tok', 'cat', sub { $_[0]{tokens_left} == 100 }, 'cat refunded');
    is($kc->{tokens_left}, 100, 'cat: gone before the engine accepted it: the prompt given back');
    is($kc->{prompt_tokens}, 0, '  and no prompt tokens counted');
    $g->engine->signal('CONT');
    $g->t->wait_log('logs/limit.log', qr/^499 t=cat /);
}

# ---- a full zone reclaims the least recently used keys; the pages list 32 keys ------------------

{
    my $n = 300;
    my $bad = 0;
    for my $i (0 .. $n - 1) {
        my $rr = req('/r/v1/completions', { prompt => 'Once upon a time', max_tokens => 1 }, sprintf('r%03d', $i));
        $bad++ if $rr->{status} != 200;
    }
    is($bad, 0, "$n tenants in a 32k zone: each admitted once (a 6-token burst)");
    $r = req('/r/v1/completions', { prompt => 'Once upon a time', max_tokens => 1 }, sprintf('r%03d', $n - 1));
    is($r->{status}, 429, 'the last tenant again: refused (its key is kept)');
    $r = req('/r/v1/completions', { prompt => 'Once upon a time', max_tokens => 1 }, 'r000');
    is($r->{status}, 200, 'the first tenant again: admitted (its key was reclaimed, its bucket full again)');
    my $mz = $g->wait_metrics(sub { $g->metric($_[0], 'kvgate_limit_other_refused_total{zone="small"}')
                                    + $g->metric($_[0], 'kvgate_limit_refused_total{zone="small",key="r299"}') == 1 },
                              'the small zone counted');
    my $keys = $g->metric($mz, 'kvgate_limit_keys{zone="small"}');
    my $reclaimed = $g->metric($mz, 'kvgate_limit_keys_reclaimed_total{zone="small"}');
    ok($keys > 0 && $keys < $n, "metrics: $keys keys held");
    is($keys + $reclaimed, $n + 1, "metrics: $reclaimed reclaimed (held + reclaimed = keys ever made)");
    my @listed = grep { /^kvgate_limit_requests_total\{zone="small",/ } split /\n/, $mz;
    is(scalar @listed, 32, 'metrics: 32 keys of the zone listed');
    my $sum = 0;
    $sum += (split ' ', $_)[1] for @listed;
    is($sum + $g->metric($mz, 'kvgate_limit_other_requests_total{zone="small"}'), $n + 1,
       'metrics: listed + other = every admitted request');
    my $sz = $g->status;
    my ($zs) = grep { $_->{zone} eq 'small' } @{ $sz->{token_limits} // [] };
    is(scalar @{ $zs->{top} // [] }, 32, 'status: 32 keys listed');
    is($zs->{total}{requests}, $n + 1, 'status: the zone total');
}

# ---- a reload keeps the buckets and counters ----------------------------------------------------

$g->reload;
$r = req('/a/v1/completions', { prompt => 'Once upon a time', max_tokens => 30 }, 'ant');
is($r->{status}, 429, 'after a reload: ant still refused (its bucket lives on)');
$r = req('/a/v1/completions', { prompt => 'Once upon a time', max_tokens => 1 }, 'bee');
is($r->{status}, 200, 'after a reload: bee still admitted');
$k = key_status('tok', 'ant', sub { $_[0]{refused} == 5 }, 'ant counted after the reload');
is($k->{refused}, 5, 'status: ant 5 refused, counted over the reload');

# ---- configuration errors name the directive ----------------------------------------------------

my $srv = 'server { listen 127.0.0.1:%%PORT%%; location /v1/ { kvgate_pass; LIMIT } }';
my $eng = 'kvgate_engine unix:%%PREFIX%%/engine.sock;';
my $zone = 'kvgate_limit_tokens_zone $kvgate_tenant zone=z:1m;';
for my $c (
    [ "$zone", 'zone=z rate=10/m burst=50 cached=0.1', qr/^$/, 'a good one' ],
    [ '', 'zone=nope rate=10/m', qr/unknown zone "nope" in "kvgate_limit_tokens" directive/,
      'an undeclared zone' ],
    [ "$zone", 'zone=z rate=10/h', qr/invalid rate "rate=10\/h" in "kvgate_limit_tokens" directive/,
      'a bad rate' ],
    [ "$zone", 'zone=z rate=0/s', qr/invalid rate "rate=0\/s" in "kvgate_limit_tokens" directive/,
      'a zero rate' ],
    [ "$zone", 'zone=z rate=1/s cached=2', qr/invalid cached weight "cached=2" in "kvgate_limit_tokens"/,
      'a weight over 1' ],
    [ "$zone", 'zone=z rate=1/s burst=0', qr/invalid burst "burst=0" in "kvgate_limit_tokens"/,
      'a zero burst' ],
    [ "$zone", 'zone=z', qr/"kvgate_limit_tokens" must have "rate" parameter/, 'no rate' ],
    [ 'kvgate_limit_tokens_zone $kvgate_tenant zone=z:4k;', 'zone=z rate=1/s',
      qr/zone "z" is too small in "kvgate_limit_tokens_zone" directive/, 'a zone too small' ],
    [ 'kvgate_limit_tokens_zone $kvgate_tenant zone=z;', 'zone=z rate=1/s',
      qr/invalid zone size "zone=z" in "kvgate_limit_tokens_zone" directive/, 'a zone without size' ],
    [ "$zone $zone", 'zone=z rate=1/s',
      qr/zone "z" is already declared in "kvgate_limit_tokens_zone" directive/, 'a zone declared twice' ],
) {
    my ($http, $lim, $want, $name) = @$c;
    (my $s = $srv) =~ s/LIMIT/kvgate_limit_tokens $lim;/;
    my ($rc, $out) = $g->t->nginx_t(http => "$eng\n$http\n$s");
    if ($want eq qr/^$/) {
        is($rc, 0, "nginx -t: $name passes") or diag($out);
    } else {
        isnt($rc, 0, "nginx -t: $name fails");
        like($out, $want, "  message") or diag($out);
    }
}

$g->stop;
done_testing();
