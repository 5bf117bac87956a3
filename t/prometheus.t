#!/usr/bin/perl
# kvgate_metrics read by a real Prometheus (Debian's prometheus package, installed by
# scripts/deps.sh; the test skips without it):
#   - conf.d/prometheus/kvgate-rules.yml passes `promtool check rules` and its unit
#     tests (`promtool test rules kvgate-rules.test.yml`);
#   - after traffic of every kind (completions, chat, streams, n > 1, a self-consistency
#     vote, bypass, cache hits, 400/404/503, two engines, tenants whose names need
#     escaping or are not UTF-8) /metrics passes `promtool check metrics`;
#   - a Prometheus on loopback scrapes the gateway every second with the rules loaded:
#     the raw counters it holds equal what the traffic produced (instant queries, exact),
#     the hit-rate and TTFT-quantile expressions of docs/operations.md give the values
#     the traffic implies, the recording rules agree, and KvgateEngineDown goes pending
#     for a killed engine;
#   - every expression of conf.d/grafana/kvgate-dashboard.json evaluates on that
#     Prometheus and names only metrics the gateway exports or the rules record.
#
# Exact comparisons where Prometheus's extrapolation allows them: every series the
# ratios read exists from the first scrape on with the value 0 (Prometheus is scraping
# before any traffic), so rate() over a window that covers the whole test scales each
# series' increase by the same factor (the same scrapes, no extrapolation before a zero
# start), and the factor cancels in a ratio and in histogram_quantile. What is left is
# float rounding: a relative tolerance of 1e-9.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Temp qw(tempdir);
use HTTP::Tiny;
use JSON::PP;
use List::Util qw(sum max);
use POSIX qw(ceil WNOHANG);
use Test::More;
use Time::HiRes qw(sleep time);

use Kvgate::Engine;
use Kvgate::Gateway;
use Kvgate::Test;

my %bin;
for my $name (qw(promtool prometheus)) {
    ($bin{$name}) = grep { -x } map { "$_/$name" } split(/:/, $ENV{PATH} // ''), '/usr/bin';
    plan skip_all => "$name not found: Debian's prometheus package (scripts/deps.sh installs it)"
        unless $bin{$name};
}

my $root = Kvgate::Test::repo_root();
my $rules = "$root/conf.d/prometheus/kvgate-rules.yml";
my $grafana = "$root/conf.d/grafana/kvgate-dashboard.json";

# Runs a command; (exit status, stdout+stderr).
sub run_cmd {
    my ($stdin, @cmd) = @_;
    my $dir = tempdir(CLEANUP => 1);
    open my $in, '>', "$dir/in" or die;
    print $in $stdin // '';
    close $in;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open STDIN, '<', "$dir/in";
        open STDOUT, '>', "$dir/out";
        open STDERR, '>&', \*STDOUT;
        exec @cmd or POSIX::_exit(127);
    }
    waitpid $pid, 0;
    my $rc = $? >> 8;
    open my $fh, '<', "$dir/out" or die;
    local $/;
    return ($rc, <$fh> // '');
}

# ---- the rules file ------------------------------------------------------------------------

{
    my ($rc, $out) = run_cmd('', $bin{promtool}, 'check', 'rules', $rules);
    is($rc, 0, 'promtool check rules conf.d/prometheus/kvgate-rules.yml') or diag($out);
    ($rc, $out) = run_cmd('', 'sh', '-c', "cd '$root/conf.d/prometheus' && exec '$bin{promtool}' test rules kvgate-rules.test.yml");
    is($rc, 0, 'promtool test rules kvgate-rules.test.yml') or diag($out);
}

my %recorded = do {
    open my $fh, '<', $rules or die "$rules: $!";
    map { /^\s*-\s*record:\s*(\S+)/ ? ($1 => 1) : () } <$fh>;
};
ok(keys %recorded >= 5, scalar(keys %recorded) . ' recording rules in the file');

# ---- a gateway with two engines ---------------------------------------------------------------
# The first engine (a) serves stories260K: the unlabelled engine metrics are its own,
# so all the stories traffic goes there. s serves another model, and is killed at the end.

my $d = Kvgate::Engine::shared_dir() . '/models/stories260K';
my $g = Kvgate::Gateway->new(
    engines => [ { name => 'a' },
                 { name => 's', args => [ '--model', 'synthetic:260K', '--tokenizer', "$d/tok512.bin" ] } ],
    group => 'route prefix;');
my ($syn) = map { $_->{model} } grep { $_->{name} eq 's' } @{ $g->status->{engines} };
note("engine s serves " . ($syn // "?"));

# ---- Prometheus on loopback, scraping it every second -----------------------------------------

my $pdir = tempdir('kvgate-prom-XXXXXX', DIR => $ENV{TMPDIR} && -d $ENV{TMPDIR} ? $ENV{TMPDIR} : '/tmp',
                   CLEANUP => !$ENV{KVGATE_TEST_KEEP});
my $pport = $g->t->port('prometheus');    # never one of the gateway's own
my $gport = $g->t->port(0);
{
    open my $fh, '>', "$pdir/prometheus.yml" or die;
    print $fh <<"EOF";
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - $rules
scrape_configs:
  - job_name: kvgate
    metrics_path: /metrics
    static_configs:
      - targets: ['127.0.0.1:$gport']
EOF
    close $fh;
}
my $prom_pid = fork // die "fork: $!";
if (!$prom_pid) {
    open STDIN, '<', '/dev/null';
    open STDOUT, '>', "$pdir/prometheus.log";
    open STDERR, '>&', \*STDOUT;
    exec $bin{prometheus}, "--config.file=$pdir/prometheus.yml", "--storage.tsdb.path=$pdir/data",
         "--web.listen-address=127.0.0.1:$pport", '--log.level=warn' or POSIX::_exit(127);
}
END {
    if ($prom_pid) {
        kill 'TERM', $prom_pid;
        my $deadline = time + 10;
        sleep 0.05 while waitpid($prom_pid, WNOHANG) == 0 && time < $deadline;
        kill 'KILL', $prom_pid if kill 0, $prom_pid;
    }
}

my $http = HTTP::Tiny->new(timeout => 10);

# An instant query: the API's data.result (a list of {metric, value}), undef on error.
sub query {
    my ($expr) = @_;
    my $res = $http->get("http://127.0.0.1:$pport/api/v1/query?" . $http->www_form_urlencode({ query => $expr }));
    my $j = $res->{success} ? eval { JSON::PP->new->decode($res->{content}) } : undef;
    return $j && ($j->{status} // '') eq 'success' ? $j->{data}{result} : undef;
}

# The value of a query answering one sample (undef otherwise).
sub value1 {
    my $r = query($_[0]);
    return $r && @$r == 1 ? $r->[0]{value}[1] + 0 : undef;
}

sub close_to {
    my ($got, $want, $what) = @_;
    my $ok = defined $got && abs($got - $want) <= 1e-9 * max(1, abs $want);
    ok($ok, $what) or diag('got ' . ($got // 'undef') . ", want $want");
}

my $ready = Kvgate::Test->wait_for(sub { ($http->get("http://127.0.0.1:$pport/-/ready")->{status} // 0) == 200 },
                                   'Prometheus ready', 60);
ok($ready, 'Prometheus ready') or do {
    open my $fh, '<', "$pdir/prometheus.log";
    local $/;
    diag(<$fh> // '');
    done_testing;
    exit;
};
ok(Kvgate::Test->wait_for(sub { (value1('up{job="kvgate"}') // 0) == 1 && (value1('count(kvgate_prompt_tokens_total)') // 0) > 0
                                && (value1('count(kvgate_time_to_first_token_seconds_bucket)') // 0) > 0 },
                          'the first scrape of the gateway', 30),
   'Prometheus scrapes the gateway (up == 1) before any traffic');
is(value1('sum(kvgate_prompt_tokens_total)'), 0, '  and counts no prompt token yet');

# ---- traffic of every kind ---------------------------------------------------------------------

my $system = join ' ', ('Once upon a time there was a little girl named Lily.') x 12;
my %status;   # HTTP status => requests through kvgate_pass

sub count_status { $status{ $_[0] }++; return $_[0] }

sub done {
    my ($what, $st, $want) = @_;
    count_status($st);
    return is($st, $want, "$what: $want");
}

my $r;
for my $tenant (qw(acme globex)) {
    done("$tenant: completion", $g->completion({ prompt => "$system One.", max_tokens => 4, temperature => 0 },
                                              'X-Tenant-Id' => $tenant)->{status}, 200);
    $r = $g->completion({ prompt => "$system Two.", max_tokens => 4, temperature => 0 }, 'X-Tenant-Id' => $tenant);
    done("$tenant: the same prefix again", $r->{status}, 200);
    is($r->{headers}{'x-kvgate-cache'}, 'hit', '  a cache hit');
}
$r = $g->completion({ prompt => 'Hi', max_tokens => 2 }, 'X-Tenant-Id' => 'acme');
done('a short prompt', $r->{status}, 200);
is($r->{headers}{'x-kvgate-cache'}, 'bypass', '  bypass');
done('chat, n = 3', $g->chat({ messages => [ { role => 'user', content => "$system Three." } ], max_tokens => 4, n => 3 },
                             'X-Tenant-Id' => 'globex')->{status}, 200);
{
    my ($st) = $g->stream('/v1/chat/completions', { messages => [ { role => 'user', content => "$system Three." } ],
                                                   max_tokens => 4, stream_options => { include_usage => JSON::PP::true } },
                          'X-Tenant-Id' => 'globex');
    done('a streamed chat', $st, 200);
    ($st) = $g->stream('/v1/completions', { prompt => "$system Four.", max_tokens => 4, n => 2 }, 'X-Tenant-Id' => 'acme');
    done('a streamed completion, n = 2', $st, 200);
}
done('a self-consistency vote', $g->completion({ prompt => "$system Vote.", max_tokens => 4, n => 4,
                                                 kvgate => { vote => 'majority' } })->{status}, 200);
# Tenants whose names must be escaped in a label, and one that is not UTF-8: cached
# (long prompts), so that they are listed in kvgate_tenant_cached_blocks.
my %odd = ('q"uo\\te' => 'q"uo\\te', "w\xffx" => 'w\\xffx');
for my $tenant (sort keys %odd) {
    my $s = $g->send_raw('/v1/completions', { model => 'stories260K', prompt => "$system Odd.", max_tokens => 2 },
                         'X-Tenant-Id' => $tenant);
    my ($st) = $g->parse_http($g->read_all($s));
    close $s;
    done("tenant $odd{$tenant}", $st, 200);
}
$r = $g->completion({ model => $syn, prompt => "$system Five.", max_tokens => 4 });
done("the other engine's model", $r->{status}, 200) or diag($r->{body});
done('bad JSON', $g->post('/v1/completions', '{"model": ')->{status}, 400);
done('an unknown model', $g->completion({ model => 'gpt-4', prompt => 'x' })->{status}, 404);

$g->engine_named('s')->kill('KILL');
$g->wait_status(sub { !grep { $_->{name} eq 's' && $_->{up} } @{ $_[0]{engines} } }, 'engine s seen down');
done('the model of a killed engine', $g->completion({ model => $syn, prompt => 'x y z' })->{status}, 503);

my $n = sum values %status;
my $m = $g->wait_metrics(sub {
    my $c = 0;
    $c += $1 while $_[0] =~ /^kvgate_requests_total\{[^}]*\} (\d+)$/mg;
    $c == $n;
}, "all $n requests counted");

# What the gateway logged per request: the prompt, cached tokens and TTFT of those answered.
my @log = grep { /^200 .* p=\d+ / } $g->wait_log(qr/^\d{3} t=/, count => $n);
my $prompt = sum(map { / p=(\d+) / } @log);
my $cached = sum(map { / c=(\d+) / } @log);
my @ttft = sort { $a <=> $b } map { / ttft=([\d.]+) / ? $1 : () } @log;
ok($cached > 0 && $cached < $prompt, "the traffic: $cached of $prompt prompt tokens cached, " . @ttft . ' first tokens');

# ---- promtool check metrics ----------------------------------------------------------------------

{
    my ($rc, $out) = run_cmd($m, $bin{promtool}, 'check', 'metrics');
    is($rc, 0, 'promtool check metrics passes on /metrics after that traffic');
    is($out, '', '  and says nothing') or diag($out);
}

# ---- what Prometheus holds ------------------------------------------------------------------------

my $synced = Kvgate::Test->wait_for(sub {
    (value1('sum(kvgate_requests_total)') // -1) == $n && (value1('sum(kvgate_prompt_tokens_total)') // -1) == $prompt
        && (value1('sum(kvgate_time_to_first_token_seconds_count)') // -1) == @ttft
}, 'a scrape after the traffic', 30);
ok($synced, 'Prometheus scraped the final counters');

{
    my %got = map { $_->{metric}{status} => $_->{value}[1] + 0 } @{ query('sum by (status) (kvgate_requests_total)') // [] };
    is_deeply(\%got, \%status, 'sum by (status) (kvgate_requests_total): the statuses sent');
    is(value1('sum(kvgate_cached_tokens_total)'), $cached, 'sum(kvgate_cached_tokens_total): the cached tokens logged');
    my %t = map { $_->{metric}{tenant} => $_->{value}[1] } @{ query('kvgate_tenant_cached_blocks') // [] };
    ok(exists $t{$_} && $t{$_} > 0, "kvgate_tenant_cached_blocks{tenant=\"$_\"} holds blocks (label escaped)")
        or diag(join ', ', keys %t) for sort values %odd;
    is(value1('kvgate_engine_connected{engine="s"}'), 0, 'kvgate_engine_connected{engine="s"} 0');
    is(value1('kvgate_engine_connected{engine="a"}'), 1, 'kvgate_engine_connected{engine="a"} 1');
}

# The documented expressions (docs/operations.md) with the window widened to cover the
# whole test: [5m] would too on a fast machine, not necessarily under ASan.
sub widened { (my $e = $_[0]) =~ s/\[5m\]/[1h]/g; return $e }

my $HIT_RATE = 'sum(rate(kvgate_cached_tokens_total[5m])) / sum(rate(kvgate_prompt_tokens_total[5m]))';
my $ENGINE_HIT_RATE = 'sum(rate(kvgate_prefix_cache_hit_tokens_total[5m])) / sum(rate(kvgate_prefix_cache_query_tokens_total[5m]))';
my $TTFT = 'histogram_quantile(%s, sum by (le) (rate(kvgate_time_to_first_token_seconds_bucket[5m])))';

close_to(value1(widened($HIT_RATE)), $cached / $prompt, "hit rate (tokens): $cached / $prompt");
{
    my $q = value1('sum(kvgate_prefix_cache_query_tokens_total)');
    my $h = value1('sum(kvgate_prefix_cache_hit_tokens_total)');
    ok($q && $h && $h < $q, "the engine's prefix cache: $h of $q tokens");
    close_to(value1(widened($ENGINE_HIT_RATE)), $h / $q, "the engine's hit rate: $h / $q");
}

# histogram_quantile as Prometheus computes it, on the raw cumulative buckets.
my %bucket = map { $_->{metric}{le} => $_->{value}[1] + 0 } @{ query('kvgate_time_to_first_token_seconds_bucket') // [] };
my @le = sort { $a <=> $b } grep { $_ ne '+Inf' } keys %bucket;
is($bucket{'+Inf'}, scalar @ttft, 'the TTFT histogram counts every first token logged');

sub quantile_of_buckets {
    my ($q) = @_;
    my $total = $bucket{'+Inf'};
    my $rank = $q * $total;
    my ($lo, $below) = (0, 0);
    for my $le (@le) {
        if ($bucket{$le} >= $rank) {
            return ($lo + ($le - $lo) * ($rank - $below) / ($bucket{$le} - $below), $lo, $le);
        }
        ($lo, $below) = ($le, $bucket{$le});
    }
    return ($le[-1], $le[-1], 'inf');
}

for my $q (0.5, 0.99) {
    my ($want, $lo, $hi) = quantile_of_buckets($q);
    close_to(value1(widened(sprintf $TTFT, $q)), $want, "TTFT p" . ($q * 100) . ": histogram_quantile of the buckets ($want)");
    # The logged TTFT of that rank lies in the bucket the quantile was interpolated in.
    my $v = $ttft[ max(0, ceil($q * @ttft) - 1) ];
    ok($v > $lo && ($hi eq 'inf' || $v <= $hi), "  the logged p" . ($q * 100) . " ($v s) is in ($lo, $hi]");
}

# The recording rules: the same expressions over [5m], evaluated every second.
{
    my $all_in_5m = 1;   # whether the test ran within the rules' window
    my $p50 = (quantile_of_buckets(0.5))[0];
    my $ok = Kvgate::Test->wait_for(sub {
        my $hr = value1('job:kvgate_cache_hit_ratio:rate5m');
        my $t50 = value1('job:kvgate_time_to_first_token_seconds:p50_5m');
        defined $hr && defined $t50 && abs($hr - $cached / $prompt) <= 1e-9 && abs($t50 - $p50) <= 1e-9 * max(1, $p50);
    }, 'the recording rules evaluated after the last scrape', 30);
    ok($ok, 'job:kvgate_cache_hit_ratio:rate5m and job:kvgate_time_to_first_token_seconds:p50_5m agree');
    # A series kvgate_requests_total gets at its first request needs a second scrape
    # before rate() has two samples of it.
    ok(Kvgate::Test->wait_for(sub { defined value1('job:kvgate_requests:rate5m') }, 'job:kvgate_requests:rate5m', 30),
       'job:kvgate_requests:rate5m recorded');
}

# A killed engine: KvgateEngineDown pending (it fires after a minute, which this test
# does not wait for; promtool test rules checks the firing).
ok(Kvgate::Test->wait_for(sub { (value1('count(ALERTS{alertname="KvgateEngineDown",engine="s",alertstate=~"pending|firing"})') // 0) == 1 },
                          'KvgateEngineDown for engine s', 30),
   'KvgateEngineDown pending for engine s');
is(value1('count(ALERTS{alertname="KvgateEngineDown",engine="a"})'), undef, '  and not for engine a');

# ---- the Grafana dashboard ----------------------------------------------------------------------

{
    open my $fh, '<', $grafana or die "$grafana: $!";
    my $dash = eval { local $/; JSON::PP->new->decode(<$fh>) };
    ok($dash && ref $dash->{panels} eq 'ARRAY' && @{ $dash->{panels} }, 'the Grafana dashboard parses and has panels')
        or diag($@);
    my %families = map { /^# TYPE (\S+)/ ? ($1 => 1) : () } split /\n/, $m;
    my @exprs = map { $_->{expr} } grep { defined $_->{expr} } map { @{ $_->{targets} // [] } } @{ $dash->{panels} // [] };
    ok(@exprs >= 8, scalar(@exprs) . ' expressions in the dashboard');
    for my $e (@exprs) {
        my $res = $http->get("http://127.0.0.1:$pport/api/v1/query?" . $http->www_form_urlencode({ query => $e }));
        my $j = eval { JSON::PP->new->decode($res->{content}) } // {};
        is($j->{status}, 'success', "evaluates: $e") or diag($res->{content});
        my @unknown = grep { my $f = $_; $f =~ s/_(?:bucket|sum|count)$// unless $families{$f}; !$families{$f} && !$recorded{$_} }
                      grep { !/^(?:by|without|on|ignoring|le)$/ } $e =~ /\b((?:[a-z_]+:)*kvgate_[a-z0-9_]+(?::[a-z0-9_]+)*)/g;
        is("@unknown", '', "  names only exported or recorded series");
    }
}

$g->stop;
done_testing;
