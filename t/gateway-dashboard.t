#!/usr/bin/perl
# The live status page (kvgate_status to a browser): the embedded page is the one in
# ngx_module/dashboard/; HTML goes to clients that ask for it and the JSON stays what
# every other client gets; then Debian's chromium, headless and driven through the
# DevTools protocol (a small websocket client below), loads the page from a running
# gateway after known traffic: the rendered values agree with /metrics, the plots have
# data points, the page updates by itself after more traffic, and it fits a phone's
# width. Screenshots: $BUILD/dashboard.png (laptop) and $BUILD/dashboard-phone.png.
# Skips the browser part with a message when chromium is not installed (make deps
# installs it; KVGATE_CHROMIUM=path names another binary).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Digest::SHA qw(sha1);
use File::Temp qw(tempdir);
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use MIME::Base64 qw(encode_base64 decode_base64);
use POSIX qw(WNOHANG);
use Test::More;
use Time::HiRes qw(sleep time);

use Kvgate::Gateway;

my $root = Kvgate::Test::repo_root();

# ---- the committed C file is what the page's source makes --------------------------------

{
    my $gen = `perl $root/ngx_module/dashboard/embed.pl $root/ngx_module/dashboard/index.html`;
    is($?, 0, 'embed.pl runs');
    my $have = do { local (@ARGV, $/) = "$root/ngx_module/ngx_http_kvgate_dashboard.c"; <> };
    ok($gen eq $have, 'ngx_module/ngx_http_kvgate_dashboard.c is up to date with dashboard/index.html')
        or diag('run: make ngx_module/ngx_http_kvgate_dashboard.c');
}

my $g = Kvgate::Gateway->new;
my $t = $g->t;
my $json = JSON::PP->new;

# ---- who gets what -----------------------------------------------------------------------

my $page = $t->get('/status', Accept => 'text/html,application/xhtml+xml,*/*;q=0.8');
is($page->{status}, 200, 'the page: 200');
like($page->{headers}{'content-type'}, qr{^text/html}, 'the page is HTML');
like($page->{headers}{'content-security-policy'} // '', qr/default-src 'none'/,
     'a Content-Security-Policy that lets the page load nothing from elsewhere');
my $src = do { local (@ARGV, $/) = "$root/ngx_module/dashboard/index.html"; <> };
ok($page->{body} eq $src, 'the page served is dashboard/index.html, byte for byte');
ok(length($page->{body}) < 64 * 1024, sprintf('the page is small (%.1f KiB)', length($page->{body}) / 1024));
unlike($page->{body}, qr/<(?:script|link|img)[^>]+(?:src|href)\s*=\s*["']?(?:https?:)?\/\//i,
       'no external scripts, styles or images');

for my $case (['no Accept', {}], ['Accept: application/json', { Accept => 'application/json' }],
              ['Accept: */*', { Accept => '*/*' }]) {
    my $r = $t->get('/status', %{ $case->[1] });
    like($r->{headers}{'content-type'}, qr{^application/json}, "$case->[0]: JSON, as before");
    ok($r->{json} && $r->{json}{engine}{up}, "$case->[0]: the status JSON");
}
my $forced = $t->get('/status?format=json', Accept => 'text/html');
like($forced->{headers}{'content-type'}, qr{^application/json}, '?format=json wins over Accept: text/html');
like($t->get('/status?format=html')->{headers}{'content-type'}, qr{^text/html}, '?format=html: the page');
my $head = $t->request('HEAD', '/status', headers => { Accept => 'text/html' });
is($head->{status}, 200, 'HEAD of the page');
is($head->{body}, '', 'HEAD: no body');

# ---- known traffic -----------------------------------------------------------------------

my $doc = join ' ', map { $_->{full_text} } @{ $json->decode(do {
    open my $fh, '<', Kvgate::Engine::shared_dir() . '/models/stories260K/golden-greedy.json' or die $!;
    local $/; <$fh>
})->{cases} }[0 .. 1];
$doc = substr($doc, 0, 900);

sub requests_total {
    my ($m) = @_;
    my $n = 0;
    $n += $_ for $m =~ /^kvgate_requests_total\{[^}]*\} (\d+)$/mg;
    return $n;
}

my $sent = 0;
sub traffic {
    my ($round) = @_;
    my $req = { prompt => "$doc\nQuestion $round: who is in the story?", max_tokens => 8, temperature => 0 };
    for my $tenant ('acme', 'acme', 'beta') {
        is($g->completion($req, 'X-Tenant-Id' => $tenant)->{status}, 200, "round $round: a long prompt for $tenant");
        $sent++;
    }
    is($g->completion({ prompt => 'Once upon a time', max_tokens => 4 }, 'X-Tenant-Id' => 'acme')->{status}, 200,
       "round $round: a short (bypass) prompt");
    is($g->post('/v1/completions', { model => 'no-such-model', prompt => 'x' })->{status}, 404,
       "round $round: an unknown model (404)");
    $sent += 2;
    my $want = $sent;
    $g->wait_metrics(sub { requests_total($_[0]) >= $want }, "$want requests counted");
}
traffic(1);

# ---- the browser -------------------------------------------------------------------------

# KVGATE_CHROMIUM=path: another browser binary (a path that does not exist: the skip).
my ($chromium) = grep { -x } ($ENV{KVGATE_CHROMIUM} // map { ("/usr/bin/$_", "/usr/local/bin/$_") }
                                                     qw(chromium chromium-browser google-chrome));
unless ($chromium) {
    SKIP: { skip 'chromium is not installed (make deps installs it): no browser checks', 1 }
    $g->stop;
    done_testing;
    exit 0;
}

# Ends the file after a failed step the others depend on (the failure is already counted).
sub give_up {
    my ($why) = @_;
    diag($why);
    $g->stop;
    done_testing;
    exit 1;
}

my $profile = tempdir('kvgate-chromium-XXXXXX', TMPDIR => 1, CLEANUP => 1);
my $url = $t->url('/status');
my $chrome_pid = fork // die "fork: $!";
if ($chrome_pid == 0) {
    open STDOUT, '>', "$profile/chromium.out";
    open STDERR, '>&', \*STDOUT;
    # --no-sandbox: the tests may run as root (CI), where chromium refuses its sandbox.
    exec $chromium, qw(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run
                       --no-default-browser-check --disable-extensions --disable-background-networking
                       --disable-component-update --disable-sync --mute-audio --hide-scrollbars
                       --remote-debugging-port=0), '--window-size=1280,1500',
         "--user-data-dir=$profile", $url;
    exit 127;
}
END {
    local $?;   # waitpid sets it: keep the test's exit status
    if ($chrome_pid) {
        kill 'TERM', $chrome_pid;
        my $deadline = time + 5;
        sleep 0.05 while waitpid($chrome_pid, WNOHANG) == 0 && time < $deadline;
        kill 'KILL', $chrome_pid if waitpid($chrome_pid, WNOHANG) == 0;
    }
}

# chromium writes the port it picked to DevToolsActivePort in its profile.
my $dt_port = $t->wait_for(sub {
    open my $fh, '<', "$profile/DevToolsActivePort" or return;
    my $p = <$fh>;
    return $p && $p =~ /^(\d+)\s*$/ ? $1 : undef;
}, 'chromium listening for DevTools', 60);
ok($dt_port, 'chromium started with DevTools') or do {
    give_up("chromium did not start:\n" . (`cat $profile/chromium.out 2>/dev/null` // ''));
};

my $target = $t->wait_for(sub {
    my $r = Kvgate::Test::http_client()->get("http://127.0.0.1:$dt_port/json/list");
    return unless $r->{success};
    my $list = eval { $json->decode($r->{content}) } // [];
    my ($p) = grep { $_->{type} eq 'page' && $_->{url} =~ m{/status} } @$list;
    return $p;
}, 'the page target in chromium', 30);
ok($target, 'the page is open in chromium') or give_up('chromium lists no page for the status page');

my $cdp = Cdp->open_ws($dt_port, $target->{webSocketDebuggerUrl});
ok($t->wait_for(sub {
    eval { $cdp->js("document.readyState === 'complete' && !!document.getElementById('conn')") };
}, 'the page loaded in chromium', 30), 'the page loaded in chromium')
    or diag('chromium shows: ' . (eval { $cdp->js('document.documentElement ? document.documentElement.outerHTML.slice(0, 300) : location.href') } // $@));

# The rendered state: every data-k's data-v (and text), the plots' data points, the
# page's poll count and connection pill, and whether it fits the viewport's width.
my $probe = <<'JS';
(function () {
  var v = {}, pts = {};
  document.querySelectorAll('[data-k]').forEach(function (e) {
    v[e.getAttribute('data-k')] = { v: e.getAttribute('data-v'), text: e.textContent };
  });
  document.querySelectorAll('.plot').forEach(function (p) {
    var n = 0;
    p.querySelectorAll('path[data-n]').forEach(function (x) { n = Math.max(n, +x.getAttribute('data-n')); });
    pts[p.id] = n;
  });
  var res = performance.getEntriesByType('resource').map(function (r) { return r.name; });
  var conn = document.getElementById('conn');   /* null while the page still loads */
  return JSON.stringify({ values: v, points: pts, conn: conn ? conn.textContent : null,
                          resources: res, origin: location.origin,
                          overflow: document.documentElement.scrollWidth - window.innerWidth });
})()
JS

sub dom { return eval { $json->decode($cdp->js($probe)) } // { values => {}, points => {}, error => $@ } }
sub val { my ($d, $k) = @_; my $x = $d->{values}{$k}; return $x && length $x->{v} ? $x->{v} : undef }

# What the page must show, from /metrics.
sub expected {
    my ($m) = @_;
    my %e;
    my $sumof = sub { my $n = 0; $n += $_ for $m =~ /^$_[0]\{[^}]*\} (\S+)$/mg; $n };
    $e{req_total} = requests_total($m);
    my %st;
    $st{$1} += $2 while $m =~ /^kvgate_requests_total\{[^}]*status="(\w+)"[^}]*\} (\d+)$/mg;
    $e{"status:$_"} = $st{$_} for keys %st;
    my ($p, $c) = ($sumof->('kvgate_prompt_tokens_total'), $sumof->('kvgate_cached_tokens_total'));
    $e{hit_rate_total} = $p ? $c / $p : undef;
    my $gen = $sumof->('kvgate_completion_tokens_total');
    $e{gen_total} = $gen;
    for my $q ([0.5, 'ttft_p50_total'], [0.99, 'ttft_p99_total']) {
        $e{ $q->[1] } = quantile($q->[0], $m, 'kvgate_time_to_first_token_seconds');
    }
    # the engine's own series (one engine here)
    $e{"kv_$1"} = $2 while $m =~ /^kvgate_kv_blocks\{engine="[^"]+",state="(\w+)"\} (\d+)$/mg;
    $e{"evict_$1"} = $2 while $m =~ /^kvgate_kv_evictions_total\{engine="[^"]+",cause="(\w+)"\} (\d+)$/mg;
    $e{"tenant:$1"} = $2 while $m =~ /^kvgate_tenant_cached_blocks\{engine="[^"]+",tenant="([^"]+)"\} (\d+)$/mg;
    $e{"engine:$1:up"} = $2 while $m =~ /^kvgate_engine_connected\{engine="([^"]+)"\} (\d+)$/mg;
    return \%e;
}

# histogram_quantile over a histogram's cumulative buckets in the metrics text.
sub quantile {
    my ($q, $m, $name) = @_;
    my @b;
    push @b, [$1 eq '+Inf' ? 9**9**9 : $1, $2] while $m =~ /^${name}_bucket\{le="([^"]+)"\} (\d+)$/mg;
    return undef unless @b && $b[-1][1];
    my $rank = $q * $b[-1][1];
    for my $i (0 .. $#b) {
        next if $b[$i][1] < $rank;
        return $b[$i - 1][0] if $b[$i][0] == 9**9**9;
        my ($lo, $below) = $i ? @{ $b[$i - 1] } : (0, 0);
        my $in = $b[$i][1] - $below;
        return $in > 0 ? $lo + ($b[$i][0] - $lo) * ($rank - $below) / $in : $b[$i][0];
    }
    return $b[-2][0];
}

sub same {
    my ($a, $b) = @_;
    return !defined $a && !defined $b if !defined $a || !defined $b;
    return abs($a - $b) <= 1e-6 * (1 + abs $b);
}

# Waits until the page shows what /metrics says (both settle once the traffic is over:
# the page within a poll or two), then asserts each value.
sub check_against_metrics {
    my ($what, $also) = @_;
    my ($d, $e);
    $t->wait_for(sub {
        $d = dom();
        $e = expected($g->metrics);
        return 0 if grep { !same(val($d, $_), $e->{$_}) } keys %$e;
        return $also ? $also->($d) : 1;
    }, "the page showing what /metrics says ($what)", 30);
    for my $k (sort keys %$e) {
        ok(same(val($d, $k), $e->{$k}), "$what: $k on the page is " . ($e->{$k} // 'none') . ' as in /metrics')
            or diag("the page shows " . ($d->{values}{$k}{v} // 'nothing') . " ('" . ($d->{values}{$k}{text} // '') . "')");
    }
    return wantarray ? ($d, $e) : $d;
}

my ($d, $e) = check_against_metrics('after the first traffic', sub { ($_[0]{values}{polls}{v} // 0) >= 3 });
# Every family compared was found in /metrics (a renamed metric fails here rather than
# silently leaving its values unchecked).
for my $k (qw(hit_rate_total ttft_p50_total kv_free kv_cached evict_lru tenant:acme status:200 status:404)) {
    ok(defined $e->{$k}, "/metrics has what the page's $k is compared with");
}
ok(grep(/^engine:.*:up$/, keys %$e), "/metrics has the engines' up/down the page shows");
is($d->{conn}, 'live', 'the page says it is live');
ok(val($d, 'req_total') == $sent, "the page counts the $sent requests sent");
ok(val($d, 'tenant:acme') > 0 && val($d, 'tenant:beta') > 0, 'both tenants hold cached blocks on the page');
ok(val($d, 'hit_rate_total') > 0, 'a hit rate above zero (acme sent its prompt twice)');
ok(!grep({ index($_, $d->{origin}) != 0 } @{ $d->{resources} }), 'everything the page loaded came from the gateway')
    or diag(explain($d->{resources}));
for my $p (qw(p-status p-bucket p-tps p-kv p-evict e0-plot)) {
    ok($d->{points}{$p} >= 2, "plot $p has data points ($d->{points}{$p})");
}

# ---- it updates by itself ----------------------------------------------------------------

my $polls = val($d, 'polls');
traffic(2);
$d = check_against_metrics('after more traffic', sub {
    my $x = $_[0];
    # the windowed plots (hit rate, TTFT quantiles) have points once traffic came while
    # the page was open, two polls after it
    $x->{points}{'p-ttft'} >= 2 && $x->{points}{'p-hit'} >= 2;
});
ok(val($d, 'req_total') == $sent, "the same page now counts $sent requests");
ok(val($d, 'polls') > $polls, 'without being reloaded (it kept polling)');
for my $p (qw(p-ttft p-hit)) {
    ok($d->{points}{$p} >= 2, "plot $p has data points ($d->{points}{$p})");
}

my $build = $ENV{BUILD} || 'build';
$build = "$root/$build" unless $build =~ m{^/};
sub screenshot {
    my ($file) = @_;
    my $shot = $cdp->call('Page.captureScreenshot', { format => 'png', captureBeyondViewport => JSON::PP::true });
    open my $fh, '>:raw', $file or die "$file: $!";
    print $fh decode_base64($shot->{data});
    close $fh;
    ok(-s $file > 10_000, "screenshot $file");
}
# The whole page, as tall as it is.
my $height = $cdp->js('document.documentElement.scrollHeight');
$cdp->call('Emulation.setDeviceMetricsOverride', { width => 1280, height => 0 + $height, deviceScaleFactor => 1, mobile => JSON::PP::false });
sleep 0.3;
screenshot("$build/dashboard.png");

# A phone: 390 px wide. The page re-renders on resize; nothing may stick out sideways.
$cdp->call('Emulation.setDeviceMetricsOverride', { width => 390, height => 844, deviceScaleFactor => 2, mobile => JSON::PP::true });
$polls = val(dom(), 'polls');
$t->wait_for(sub { $d = dom(); $d->{values}{polls}{v} > $polls + 1 }, 'two polls at phone width', 15);
ok($d->{overflow} <= 0, "on a phone the page fits its width (overflow $d->{overflow} px)");
$height = $cdp->js('document.documentElement.scrollHeight');
$cdp->call('Emulation.setDeviceMetricsOverride', { width => 390, height => 0 + $height, deviceScaleFactor => 1, mobile => JSON::PP::true });
sleep 0.3;
screenshot("$build/dashboard-phone.png");

$cdp->done;
$g->stop;
done_testing;

# ---- a minimal DevTools-protocol client (RFC 6455 websocket, text frames) -----------------

package Cdp;

use IO::Select;
use JSON::PP;
use MIME::Base64 qw(encode_base64);
use Time::HiRes qw(time);

sub open_ws {
    my ($class, $port, $ws) = @_;
    my ($path) = $ws =~ m{^ws://[^/]+(/.*)$} or die "odd websocket url $ws";
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Proto => 'tcp', Timeout => 10)
        or die "connect to DevTools: $!";
    my $key = encode_base64(join('', map { chr int rand 256 } 1 .. 16), '');
    $s->syswrite("GET $path HTTP/1.1\r\nHost: 127.0.0.1:$port\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 . "Sec-WebSocket-Key: $key\r\nSec-WebSocket-Version: 13\r\n\r\n");
    my $self = bless { s => $s, buf => '', id => 0, sel => IO::Select->new($s) }, $class;
    my $deadline = time + 10;
    $self->_fill($deadline) until $self->{buf} =~ /\r\n\r\n/;
    $self->{buf} =~ s/\A(.*?)\r\n\r\n//s;
    my $head = $1;
    $head =~ m{^HTTP/1\.1 101} or die "DevTools refused the websocket: $head";
    my $accept = encode_base64(Digest::SHA::sha1($key . '258EAFA5-E914-47DA-95CA-C5AB0DC85B11'), '');
    $head =~ /^Sec-WebSocket-Accept:\s*\Q$accept\E\s*$/mi or die 'a bad Sec-WebSocket-Accept';
    return $self;
}

sub _fill {
    my ($self, $deadline) = @_;
    my $left = $deadline - time;
    die "DevTools did not answer in time\n" if $left <= 0;
    return unless $self->{sel}->can_read($left);
    my $n = $self->{s}->sysread($self->{buf}, 1 << 20, length $self->{buf});
    die "DevTools closed the connection\n" unless $n;
}

sub _need {
    my ($self, $n, $deadline) = @_;
    $self->_fill($deadline) while length $self->{buf} < $n;
    return substr($self->{buf}, 0, $n, '');
}

sub _send {
    my ($self, $op, $data) = @_;
    my $len = length $data;
    my $h = chr(0x80 | $op);
    # client frames are masked (RFC 6455 5.3)
    $h .= $len < 126 ? chr(0x80 | $len) : $len < 65536 ? chr(0x80 | 126) . pack('n', $len)
                                                      : chr(0x80 | 127) . pack('Q>', $len);
    my $mask = pack('N', int rand 2**32);
    my $masked = $data ^ substr($mask x (int($len / 4) + 1), 0, $len);
    $self->{s}->syswrite($h . $mask . $masked);
}

# One whole message (fragments joined; pings answered).
sub _message {
    my ($self, $deadline) = @_;
    my $msg = '';
    while (1) {
        my ($b0, $b1) = unpack 'CC', $self->_need(2, $deadline);
        my $len = $b1 & 0x7f;
        $len = unpack 'n', $self->_need(2, $deadline) if $len == 126;
        $len = unpack 'Q>', $self->_need(8, $deadline) if $len == 127;
        my $mask = $b1 & 0x80 ? $self->_need(4, $deadline) : undef;
        my $data = $self->_need($len, $deadline);
        $data ^= substr($mask x (int($len / 4) + 1), 0, $len) if defined $mask;
        my $op = $b0 & 0x0f;
        if ($op == 0x9) { $self->_send(0xA, $data); next }
        next if $op == 0xA;
        die "DevTools closed the websocket\n" if $op == 0x8;
        $msg .= $data;
        return $msg if $b0 & 0x80;
    }
}

sub call {
    my ($self, $method, $params) = @_;
    my $id = ++$self->{id};
    $self->_send(0x1, JSON::PP->new->encode({ id => $id, method => $method, params => $params // {} }));
    my $deadline = time + 30;
    while (1) {
        my $m = JSON::PP->new->decode($self->_message($deadline));
        next unless ($m->{id} // 0) == $id;
        die "$method: $m->{error}{message}\n" if $m->{error};
        return $m->{result};
    }
}

# A JavaScript expression's value in the page.
sub js {
    my ($self, $expr) = @_;
    my $r = $self->call('Runtime.evaluate', { expression => $expr, returnByValue => JSON::PP::true });
    die "page error: " . ($r->{exceptionDetails}{exception}{description} // $r->{exceptionDetails}{text}) . "\n" if $r->{exceptionDetails};
    return $r->{result}{value};
}

sub done {
    my ($self) = @_;
    $self->_send(0x8, '');
    close $self->{s};
}
