#!/usr/bin/perl
# Bounded load through the gateway: a tenant's hot prefix is cached on one engine, but
# once that engine's load plus the work a request would add there would pass
# balance_factor x the mean, the next request with the same prefix goes to another
# engine (reason "spill") instead of piling up.
# Load is made deterministic with the engines' own admission: --max-running 2 and a
# stream of n=2 whose client does not read (kvgate_max_unsent: paused in the engine,
# keeping its two running slots), so a second request of the prefix, with a long tail
# of its own, waits on that engine with its uncached tokens counted in the engine's
# load (its cached prefix costs nothing, so it does not count).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Socket::INET;
use JSON::PP;
use Socket qw(SOL_SOCKET SO_RCVBUF pack_sockaddr_in inet_aton);
use Test::More;
use Kvgate::Engine;
use Kvgate::Gateway;

my $g = Kvgate::Gateway->new(
    workers => 1,
    engines => [ map { { name => $_, extra => [ '--max-running', '2' ] } } qw(a b c) ],
    group => 'route prefix; balance_factor 1.25;',
    http => <<'EOF');
    server {
        listen 127.0.0.1:%%PORT_1%% sndbuf=16k;
        kvgate_max_unsent 4k;
        location /v1/ {
            kvgate_pass pool;
        }
    }
EOF

my $system = join ' ', ('Once upon a time there was a little girl named Lily.') x 12;
my $port = $g->t->port(1);

# A client that sends one request and reads nothing (a small receive buffer, set
# before connecting, keeps the kernel from absorbing the stream).
sub slow_client {
    my ($b) = @_;
    my $s = IO::Socket::INET->new(Proto => 'tcp') or die "socket: $!";
    setsockopt($s, SOL_SOCKET, SO_RCVBUF, 4096) or die "SO_RCVBUF: $!";
    $s->connect(pack_sockaddr_in($port, inet_aton('127.0.0.1'))) or die "connect: $!";
    my $json = JSON::PP->new->canonical->encode($b);
    $s->syswrite("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 . "X-Tenant-Id: hot\r\nContent-Length: " . length($json) . "\r\nConnection: close\r\n\r\n$json");
    return $s;
}

sub routed {
    my ($m, $reason) = @_;
    my $n = 0;
    $n += $1 while $m =~ /^kvgate_route_requests_total\{engine="\w+",reason="$reason"\} (\d+)$/mg;
    return $n;
}

sub routed_to {
    my ($m, $engine, $reason) = @_;
    return ($m =~ /^kvgate_route_requests_total\{engine="$engine",reason="$reason"\} (\d+)$/m)[0] // 0;
}

sub load_of {
    my ($st, $name) = @_;
    my ($e) = grep { $_->{name} eq $name } @{ $st->{engines} };
    return $e ? $e->{load_tokens} // 0 : 0;
}

# 1. The hot prefix arrives as a stream nobody reads: it lands on some engine X, is paused
#    there holding X's two running slots, and X now holds the prefix's blocks.
my $slow = slow_client({ model => 'stories260K', prompt => "$system Stream.", n => 2, max_tokens => 330,
                         temperature => 0, stream => JSON::PP::true });
my $m0 = $g->wait_metrics(sub { $g->metric($_[0], 'kvgate_backpressure_total{event="pause"}') >= 1 },
                          'the unread stream paused in its engine');
ok($g->metric($m0, 'kvgate_backpressure_total{event="pause"}') >= 1, 'the unread stream is paused in its engine');
my ($x) = map { $_->{name} } grep { ($_->{load_tokens} // 0) > 0 } @{ $g->status->{engines} };
ok($x, 'the engine X holding it: ' . ($x // '?'));
$x //= 'none';

# 2. The same prefix with a long tail (some 220 tokens): X holds the prefix and the tail
#    keeps it under the bound (the bound is at least 1.25 x the request's tokens), so it
#    goes there (prefix) and waits behind the paused stream, its tail counted in X's load.
my $tail = join ' ', ('The dog ran to the park and played with a red ball.') x 11;
my $b = $g->send_raw('/v1/completions', { model => 'stories260K', prompt => "$system $tail", max_tokens => 4,
                                          temperature => 0 }, 'X-Tenant-Id' => 'hot');
my $st = $g->wait_status(sub { load_of($_[0], $x) > 100 }, "engine ${x}'s load counts the waiting request");
ok(load_of($st, $x) > 100, "engine ${x}'s load: " . load_of($st, $x) . ' tokens (one request waiting)');
my $m1 = $g->metrics;
is(routed_to($m1, $x, 'prefix'), 1, "  it was routed to $x by its prefix");

# 3. The prefix again with a short tail: it adds only that tail to X, but X's load already
#    passes 1.25 x the mean (and 1.25 x this request), so another engine takes it (spill)
#    and answers at once; the prefix becomes cached there too.
my $r = $g->post('/v1/completions', { model => 'stories260K', prompt => "$system C.", max_tokens => 4,
                                      temperature => 0 }, 'X-Tenant-Id' => 'hot');
is($r->{status}, 200, 'the third request of the prefix: 200 while X is busy');
my $m2 = $g->wait_metrics(sub { routed($_[0], 'spill') > routed($m1, 'spill') }, 'a spill counted');
is(routed($m2, 'spill'), routed($m1, 'spill') + 1, '  routed by spill');
is(routed_to($m2, $x, 'spill'), 0, "  to another engine than $x");
is($r->{json}{usage}{prompt_tokens_details}{cached_tokens}, 0, '  a miss there: its first time on that engine');

# 4. Reading the stream lets everything finish: the waiting request ran on X.
my $raw = $g->read_all($slow, 60);
like($raw, qr/data: \[DONE\]/, 'the stream completes once read');
my $braw = $g->read_all($b, 60);
like($braw, qr/^HTTP\/1\.1 200/, 'the waiting request completes');
# nginx logs a request when its connection is closed (after a lingering close, which
# waits for the client's side): close ours. The stream came through the second server,
# which keeps no access log.
close $slow;
close $b;
my @lines = $g->wait_log(qr/^200 t=hot .* e=\w+$/, count => 2);
is(scalar(grep { / e=$x$/ } @lines), 1, "the waiting request was served by $x, the spilled one elsewhere")
    or diag(join "\n", @lines);

my ($clean, @bad) = $g->finish;
ok($clean, 'no alerts, crashes or sanitizer reports') or diag(join "\n", @bad);

done_testing;
