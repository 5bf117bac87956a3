#!/usr/bin/perl
# A silent engine (issue 26): stopped with SIGSTOP, its socket open, it stalls the group
# no longer. Three stories260K engines behind one `kvgate_engines` group, route prefix,
# `kvgate_engine_stall 1s`, two workers.
#
# Under load (Kvgate::Load: plain and streamed, cached and bypass, several tenants, each
# answer checked against the same request run alone), the busiest engine is stopped:
# both workers take it for stalled (their error logs say so), the status page and the
# metrics show it (counted once), nothing more is routed to it, and every request begun
# after that is answered right by the others. After SIGCONT it rejoins: not stalled,
# and routed to again.
#
# Then, with nothing else running, what was in the engine when it stopped: a request
# with no token yet goes to another engine and gets its whole answer; a stream that
# had tokens (paused in the engine: its client does not read) ends with the error event
# an engine's death gives. With every engine of the group stopped, a request is
# answered 503 naming each as stalled.
#
# Nothing here depends on timing: every state is waited for with a deadline, and the
# time to see the stall is only reported.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Socket::INET;
use JSON::PP;
use Socket qw(SOL_SOCKET SO_RCVBUF inet_aton pack_sockaddr_in);
use Test::More;
use Time::HiRes qw(sleep time);
use Kvgate::Gateway;
use Kvgate::Load;

my @names = qw(a b c);
# The second server: a stream whose client does not read is paused in the engine
# (kvgate_max_unsent, with a fixed kernel send buffer: see t/gateway-backpressure.t).
my $g = Kvgate::Gateway->new(engines => [ map { { name => $_ } } @names ], group => 'route prefix;',
                             stall => '1s', http => <<'EOF');
    server {
        listen 127.0.0.1:%%PORT_1%% sndbuf=16k;
        kvgate_max_unsent 1k;
        location /v1/ {
            kvgate_pass pool;
        }
    }
EOF
my $t = $g->t;
my $port = $t->port(0);
my $dir = $t->prefix;
my $json = JSON::PP->new->canonical;

sub routed {
    my ($m) = @_;
    my %n = map { $_ => 0 } @names;
    $n{$1} += $2 while $m =~ /^kvgate_route_requests_total\{engine="(\w+)",reason="\w+"\} (\d+)$/mg;
    return \%n;
}

sub engine_st {
    my ($s, $name) = @_;
    my ($e) = grep { $_->{name} eq $name } @{ $s->{engines} // [] };
    return $e // {};
}

# error.log lines of this kind about engine $name: each worker writes its own
sub log_count {
    my ($re) = @_;
    return scalar(() = $t->read_file('logs/error.log') =~ /$re/g);
}

sub stall_re  { qr/the engine "$_[0]" \(pid \d+\) made no progress for \d+ ms \(kvgate_engine_stall\): stalled/ }
sub resume_re { qr/the engine "$_[0]" makes progress again: back in routing/ }

# Waits until both workers have logged one more line of $re than $before.
sub wait_both {
    my ($re, $before, $what) = @_;
    return $t->wait_for(sub { log_count($re) >= $before + 2 }, $what);
}

# ---- under load ---------------------------------------------------------------------------

my %cat = map { $_->{kind} . ' ' . ($_->{headers}{'X-Tenant-Id'} // '-') => $_ } reverse Kvgate::Load::catalog();
my @specs = map { $cat{$_} } grep { /^(?:completions|chat) +(?:plain|stream) +n=1 (?:short|cached)/ } sort keys %cat;
ok(@specs >= 8, scalar(@specs) . ' requests of the soak catalog: plain and streamed, cached and bypass');
my $refs = Kvgate::Load::references($port, \@specs);
my @pids;
my @files = map { "$dir/load-$_.txt" } 1 .. 4;
for my $i (1 .. 4) {
    push @pids, Kvgate::Load::spawn_client($port, \@specs, $refs, out => $files[$i - 1], stop => "$dir/stop",
                                           seed => $i, detail => "$dir/detail.txt", timeout => 30);
}

sub answers_after {
    my ($since, $ok) = @_;
    return scalar grep { $_->{t} - $_->{latency} > $since && $_->{verdict} =~ $ok } Kvgate::Load::results(@files);
}

ok($t->wait_for(sub { answers_after(0, qr/^ok$/) >= 20 }, 'answers before the stop', 30), 'the load runs');
my $before = routed($g->metrics);
my ($victim) = sort { $before->{$b} <=> $before->{$a} || $a cmp $b } @names;
my $e = $g->engine_named($victim);

my $stalls0 = log_count(stall_re($victim));
$e->signal('STOP');
my $t_stop = time;
ok(wait_both(stall_re($victim), $stalls0, 'both workers to see the stall'),
   sprintf('engine "%s" stopped under load: both workers take it for stalled (the first after %.1f s)',
           $victim, time - $t_stop));
my $t_seen = time;

my $st = $g->status;
my $v = engine_st($st, $victim);
ok($v->{up} && $v->{stalled}, '  the status page: up (still connected) and stalled');
like($v->{reason} // '', qr/^stalled: no progress for \d+ ms$/, "  saying why: $v->{reason}");
is($v->{stalls}, 1, '  one stall');
ok(!grep({ $_->{name} ne $victim && ($_->{stalled} || !$_->{up}) } @{ $st->{engines} }), '  the others up, not stalled');
my $m = $g->metrics;
is($g->engine_metric($m, 'kvgate_engine_stalled', undef, $victim), 1, '  kvgate_engine_stalled 1');
is($g->engine_metric($m, 'kvgate_engine_stalls_total', undef, $victim), 1,
   '  kvgate_engine_stalls_total 1: counted once, whatever the workers');
is($g->engine_metric($m, 'kvgate_engine_connected', undef, $victim), 1, '  kvgate_engine_connected 1');
like($m, qr/^# TYPE kvgate_engine_stalled gauge$/m, '  with its TYPE');

my $held = routed($m)->{$victim};
ok($t->wait_for(sub { answers_after($t_seen, qr/^ok$/) >= 30 }, 'answers while it is stalled', 30),
   '  requests begun since are answered, right, by the others');
is(routed($g->metrics)->{$victim}, $held, '  and none was routed to it');

my $resumes0 = log_count(resume_re($victim));
$e->signal('CONT');
ok(wait_both(resume_re($victim), $resumes0, 'both workers to see it move'), 'SIGCONT: it rejoins in both workers');
$st = $g->status;
$v = engine_st($st, $victim);
ok($v->{up} && !$v->{stalled} && !defined $v->{reason}, '  the status page: up, not stalled');
is($g->engine_metric($g->metrics, 'kvgate_engine_stalled', undef, $victim), 0, '  kvgate_engine_stalled 0');
ok($t->wait_for(sub { answers_after(time - 0.5, qr/^ok$/) >= 10 }, 'answers after SIGCONT', 30), '  the load goes on');

open my $fh, '>', "$dir/stop" or die;
close $fh;
waitpid $_, 0 for @pids;
my @r = Kvgate::Load::results(@files);
my %verdicts;
$verdicts{ $_->{verdict} }++ for @r;
my $summary = join ', ', map { "$_ $verdicts{$_}" } sort keys %verdicts;
# A request that had had a token from the engine when it stopped fails as on a crash
# (503 or an error event); every other answer is right.
my @bad = grep { $_->{verdict} !~ /^(?:ok|err:engine_unavailable|sse:engine_unavailable)$/ } @r;
ok(!@bad, "every answer right or failed as on a crash ($summary)") or diag($t->read_file('detail.txt'));
my @late = grep { $_->{verdict} ne 'ok' && $_->{t} - $_->{latency} > $t_seen } @r;
ok(!@late, '  every request begun after the stall was seen: right') or diag($t->read_file('detail.txt'));

# Routed to again: with nothing running, fresh tenants go by rendezvous over the three
# (a fixed order for fixed names): one of them lands on it.
$g->wait_status(sub { !grep { ($_->{scheduler}{running} // 1) || $_->{load_tokens} } @{ $_[0]{engines} } },
                'the engines idle');
$held = routed($g->metrics)->{$victim};
my $i = 0;
while (++$i <= 40 && routed($g->metrics)->{$victim} == $held) {
    $g->completion({ prompt => 'Once upon a time there was a dog.', max_tokens => 2 }, 'X-Tenant-Id' => "rejoin-$i");
}
ok(routed($g->metrics)->{$victim} > $held, "  and it takes requests again (fresh tenant $i of 40)");

# ---- what was in it when it stopped ----------------------------------------------------------

my $long = join ' ', ('Once upon a time there was a little girl named Lily.') x 10;
my $req = { prompt => $long, max_tokens => 12, temperature => 0 };
my $ref = $g->completion($req, 'X-Tenant-Id' => 'stall-t');
is($ref->{status}, 200, 'a long prompt of a fresh tenant: 200');
my ($line) = $g->wait_log(qr/^200 t=stall-t /);
my ($home) = ($line // '') =~ / e=(\w+)$/;
ok(defined $home, "  routed to engine " . ($home // '?'));
$home //= 'a';
$e = $g->engine_named($home);

# A stream of that tenant (its prefix is held there: it goes there too) whose client does
# not read: paused in the engine, tokens made.
my $r0 = routed($g->metrics)->{$home};
my $slow = IO::Socket::INET->new(Proto => 'tcp') or die "socket: $!";
setsockopt($slow, SOL_SOCKET, SO_RCVBUF, 4096) or die "SO_RCVBUF: $!";
$slow->connect(pack_sockaddr_in($t->port(1), inet_aton('127.0.0.1'))) or die "connect: $!";
my $sbody = $json->encode({ model => 'stories260K', prompt => $long, max_tokens => 300, n => 2, temperature => 0,
                            stream => JSON::PP::true });
$slow->syswrite("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Tenant-Id: stall-t\r\n"
                . "Content-Length: " . length($sbody) . "\r\nConnection: close\r\n\r\n$sbody");
ok($g->wait_status(sub { (engine_st($_[0], $home)->{scheduler}{held} // 0) >= 1 }, 'the stream paused')
       && routed($g->metrics)->{$home} == $r0 + 1,
   "a stream whose client does not read: on engine \"$home\", paused there after its first tokens");

$stalls0 = log_count(stall_re($home));
$e->signal('STOP');
# a request of the same tenant: routed there too, unless the stall was seen first
$r0 = routed($g->metrics);
my $plain = $g->send_raw('/v1/completions', { model => 'stories260K', %$req }, 'X-Tenant-Id' => 'stall-t');
my $to;
$g->wait_metrics(sub { my $n = routed($_[0]); ($to) = grep { $n->{$_} > $r0->{$_} } @names; defined $to },
                 'the request routed');
ok(wait_both(stall_re($home), $stalls0, 'both workers to see the stall'), "engine \"$home\" stopped: stalled");

my ($status, $h, $body) = $g->parse_http($g->read_all($plain, 30));
my $j = eval { decode_json($body) } // {};
is($status, 200, 'the request sent to it before the stall was seen: 200');
is($j->{choices}[0]{text}, $ref->{json}{choices}[0]{text}, '  the whole answer, the same as the reference');
SKIP: {
    skip "routed to \"$to\" after the stall was seen (a slow machine)", 1 unless ($to // '') eq $home;
    ok($t->wait_for(sub { $t->read_file('logs/error.log')
                              =~ /engine "$home" failed the request before its first token \(kvgate: engine "$home" stalled: no progress for \d+ ms \(kvgate_engine_stall 1000 ms\)\): sent to engine "\w+" instead/ },
                    'the reroute logged'),
       '  re-sent to another engine, as when an engine dies (error.log)');
}

($status, $h, $body) = $g->parse_http($g->read_all($slow, 30));
my @ev = $g->sse_events($body);
is($status, 200, 'the paused stream had begun');
my $last = $ev[-1];
ok(ref $last && $last->{error}, '  it ends with an error event') or diag(substr($body, -500));
is(ref $last ? $last->{error}{code} : '', 'engine_unavailable', '  engine_unavailable');
like(ref $last ? $last->{error}{message} // '' : '', qr/engine "$home" stalled: no progress/, '  saying it stalled');
ok(!grep({ !ref && $_ eq 'DONE' } @ev), '  and no [DONE]');

# Every engine stopped: nothing to route to.
my %c0 = map { $_ => log_count(stall_re($_)) } @names;
$g->engine_named($_)->signal('STOP') for grep { $_ ne $home } @names;
ok($t->wait_for(sub { !grep { log_count(stall_re($_)) < $c0{$_} + 2 } grep { $_ ne $home } @names },
                'both workers to see all three stalled'),
   'all three stopped: stalled');
my $all = $g->completion($req, 'X-Tenant-Id' => 'stall-t');
is($all->{status}, 503, '  a request: 503');
is($all->{headers}{'retry-after'}, 1, '  Retry-After: 1');
is($all->{json}{error}{code}, 'engine_unavailable', '  engine_unavailable');
like($all->{json}{error}{message} // '',
     qr/no engine of "pool" is available \(a: stalled: no progress for \d+ ms; b: stalled: no progress for \d+ ms; c: stalled: no progress for \d+ ms\)/,
     "  naming each as stalled: $all->{json}{error}{message}");

my %r0 = map { $_ => log_count(resume_re($_)) } @names;
$g->engine_named($_)->signal('CONT') for @names;
ok($t->wait_for(sub { !grep { log_count(resume_re($_)) < $r0{$_} + 2 } @names }, 'all three to rejoin'),
   'SIGCONT: all three rejoin');
my $again = $g->completion($req, 'X-Tenant-Id' => 'stall-t');
is($again->{status}, 200, '  a request: 200');
is($again->{json}{choices}[0]{text}, $ref->{json}{choices}[0]{text}, '  the same answer');

my ($clean, @badl) = $g->finish;
ok($clean, 'no alerts, crashes or sanitizer reports') or diag(join "\n", @badl);

done_testing;
