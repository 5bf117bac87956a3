#!/usr/bin/perl
# Faults under load, short form (t/bench/soak is the long one): a few forked keep-alive
# clients loop over a mix of requests while the engine is killed (-9) and restarted, a
# worker is killed (-9), the engine is stopped (SIGSTOP) and continued, nginx is
# reloaded, and (another engine) the KV pool is far too small. Every answer is checked
# (Kvgate::Load): its status, and for a 200 its text against the same request run
# alone; a failure must be the clean one each fault allows, and nothing may hang.
# t/gateway-faults.t covers the same faults one request at a time.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Time::HiRes qw(time);
use Kvgate::Gateway;
use Kvgate::Load;

# The second server answers after at most 1 s (kvgate_timeout), for the SIGSTOP case, which
# is about kvgate_timeout: no stall detection (t/gateway-route-stall.t has it).
my $g = Kvgate::Gateway->new(stall => 'off', http => <<'EOF');
    server {
        listen 127.0.0.1:%%PORT_1%%;
        kvgate_timeout 1s;
        location /v1/ {
            kvgate_pass;
        }
    }
EOF
my $port = $g->t->port(0);
my $port1 = $g->t->port(1);
my $dir = $g->t->prefix;

# A few of the soak's requests (both endpoints, streams, n=3, bypass and cached, two
# tenants, a bad input) and one long stream that is always in flight somewhere.
my %cat = map { $_->{kind} . ' ' . ($_->{headers}{'X-Tenant-Id'} // '-') => $_ } reverse Kvgate::Load::catalog();
my @mix = grep { defined } map { my $k = $_; (grep { index($_, $k) == 0 } sort keys %cat)[0] } (
    'completions plain  n=1 short', 'completions stream n=1 cached', 'chat        plain  n=1 cached',
    'chat        stream n=3 cached', 'completions plain  n=3 cached', 'bad input');
my @specs = map { $cat{$_} } @mix;
is(scalar @specs, 6, 'six requests of the soak catalog');
push @specs, { name => 'long', kind => 'long stream', method => 'POST', path => '/v1/completions',
               stream => 1, headers => { 'X-Tenant-Id' => 'acme' },
               body => { model => $Kvgate::Load::MODEL, prompt => 'Once upon a time', n => 4,
                         max_tokens => 300, temperature => 0.8, seed => 3, stream => JSON::PP::true } };
my $refs = Kvgate::Load::references($port, \@specs);
ok(1, 'each request run alone for its reference answer');
my @quick = map { $_->{name} } grep { $_->{name} ne 'long' } @specs;

my $round = 0;

# Starts the load: three clients on the mix, one on the long stream only, and
# optionally more (extra => [[port, [names]], ...]). Returns its handle.
sub start_load {
    my (%o) = @_;
    $round++;
    my $h = { stop => "$dir/stop-$round", files => [], pids => [] };
    my @who = (([ $port, \@quick ]) x 3, [ $port, ['long'] ], @{ $o{extra} // [] });
    my $i = 0;
    for my $w (@who) {
        my $f = "$dir/load-$round-" . $i++ . '.txt';
        push @{ $h->{files} }, $f;
        push @{ $h->{pids} }, Kvgate::Load::spawn_client($w->[0], $o{specs} // \@specs, $o{refs} // $refs,
            out => $f, stop => $h->{stop}, only => $w->[1], seed => $round * 10 + $i,
            detail => "$dir/detail-$round.txt", timeout => 30);
    }
    return $h;
}

# Waits until at least $n answers ended after $since with a verdict in $ok (default: ok).
sub wait_answers {
    my ($h, $n, $since, $what, $ok) = @_;
    $ok //= qr/^ok$/;
    return $g->t->wait_for(sub {
        (grep { $_->{t} > $since && $_->{verdict} =~ $ok } Kvgate::Load::results(@{ $h->{files} })) >= $n
    }, $what, 30);
}

# Stops the clients (each finishes its request: at most its 30 s timeout) and returns
# all the answers.
sub stop_load {
    my ($h) = @_;
    open my $fh, '>', $h->{stop} or die;
    close $fh;
    waitpid $_, 0 for @{ $h->{pids} };
    return Kvgate::Load::results(@{ $h->{files} });
}

sub verdicts {
    my (@r) = @_;
    my %v;
    $v{ $_->{verdict} }++ for @r;
    return join(', ', map { "$_ $v{$_}" } sort keys %v);
}

# The answers outside $allowed, with the details of the first few on failure.
sub check_allowed {
    my ($r, $allowed, $what) = @_;
    my @bad = grep { $_->{verdict} !~ $allowed } @$r;
    ok(!@bad, "$what: every answer right or failed cleanly (" . verdicts(@$r) . ')')
        or diag($g->t->read_file("detail-$round.txt"));
    return !@bad;
}

# ---- the engine killed mid-stream, then started again ----------------------------------

{
    my $h = start_load();
    wait_answers($h, 8, 0, 'answers before the kill');
    $g->wait_status(sub { $_[0]{scheduler}{running} >= 1 }, 'a request running in the engine');
    $g->engine->kill('KILL');
    # (each worker notices on its own: wait until both answer 503 before the restart)
    wait_answers($h, 2, time, '503s while the engine is away', qr/^err:engine_unavailable$/);
    $g->engine->restart;
    my $back = time;
    $g->wait_up;
    ok(wait_answers($h, 8, $back, 'right answers after the restart'),
       'engine kill -9 under load, restarted: right answers again');
    my @r = stop_load($h);
    check_allowed(\@r, qr/^(?:ok|err:engine_unavailable|sse:engine_unavailable)$/, '  meanwhile');
    ok((grep { $_->{verdict} =~ /engine_unavailable/ } @r), '  in-flight and new requests got 503 or an error event');
    ok(!(grep { $_->{verdict} eq 'err:engine_unavailable' && $_->{status} != 503 } @r), '  each refusal a 503');
}

# ---- a worker killed: the master starts another, the other worker is untouched --------

my @killed;
{
    my $h = start_load();
    wait_answers($h, 8, 0, 'answers before the kill');
    my @w = $g->worker_pids;
    is(scalar @w, 2, 'two workers');
    # the one serving more of the clients (each client holds one keep-alive connection)
    my %conns = map { $_ => $g->worker_connections($_) } @w;
    @w = sort { $conns{$b} <=> $conns{$a} } @w;
    my $held = $conns{ $w[0] };
    ok($held >= 1, "the worker killed holds $held of the clients' connections");
    kill 'KILL', $w[0];
    push @killed, $w[0];
    ok($g->t->wait_for(sub { my @n = $g->worker_pids; @n == 2 && !grep { $_ == $w[0] } @n },
                       'a new worker', 20), 'worker kill -9 under load: the master starts another');
    $g->wait_up;
    my $back = time;
    ok(wait_answers($h, 8, $back, 'right answers after the respawn'), '  right answers go on');
    my @r = stop_load($h);
    # (a client whose connection was on the killed worker loses that one request: a
    # stream cut short, its text so far a prefix of the right one; an answer not begun
    # is sent again on a new connection)
    check_allowed(\@r, qr/^(?:ok|transport)$/, '  meanwhile');
    my $lost = grep { $_->{verdict} eq 'transport' } @r;
    ok($lost <= $held, "  at most one lost request per connection on that worker ($lost)");
}

# ---- the engine stopped (SIGSTOP) under load, then continued ------------------------------

{
    # a fourth client on the server whose requests time out after 1 s
    my $h = start_load(extra => [ [ $port1, [ $quick[0] ] ] ]);
    wait_answers($h, 8, 0, 'answers before the stop');
    kill 'STOP', $g->engine->pid;
    my $stopped = time;
    # (stopped until a request times out: a second or so)
    ok(wait_answers($h, 1, $stopped, 'a 504 from the 1 s server', qr/^err:timeout$/),
       'engine stopped under load: a request past kvgate_timeout is answered 504');
    kill 'CONT', $g->engine->pid;
    my $cont = time;
    ok(wait_answers($h, 8, $cont, 'right answers after SIGCONT'), '  continued: right answers go on');
    my @r = stop_load($h);
    check_allowed(\@r, qr/^(?:ok|err:timeout|sse:timeout)$/, '  meanwhile (the others answered late)');
    ok(!(grep { $_->{verdict} eq 'err:timeout' && $_->{status} != 504 } @r), '  each timeout a 504');
}

# ---- reloads under load ---------------------------------------------------------------------

{
    my $h = start_load();
    wait_answers($h, 8, 0, 'answers before the reloads');
    for my $i (1 .. 3) {
        my @old = $g->worker_pids;
        my @new = $g->reload;
        ok(@new == 2 && !grep({ my $o = $_; grep { $_ == $o } @new } @old), "reload $i: new workers");
        wait_answers($h, 4, time, "answers after reload $i");
    }
    my $last = time;
    ok(wait_answers($h, 8, $last, 'right answers after the reloads'), '  right answers after the reloads');
    my @r = stop_load($h);
    check_allowed(\@r, qr/^ok$/, '3 reloads under load');
    # a new worker holds requests until its handshake is done (kvgate_connect_wait)
    is(scalar(grep { $_->{verdict} ne 'ok' } @r), 0, '  all answered 200 with the right text');
}

{
    my ($clean, @bad) = $g->finish(@killed ? qr/worker process (?:@{[ join '|', @killed ]}) exited on signal 9/ : undef);
    ok($clean && !@bad, 'nginx quits cleanly; no alert but the killed worker\'s') or diag(join "\n", @bad);
}

# ---- a KV pool far too small: right answers or a clear refusal, never wrong text ------------

{
    # 48 blocks of 16 tokens; each long prompt holds about 20 of them
    my $p = Kvgate::Gateway->new(engine => [ '--kv-memory', '1M', '--max-waiting', '4' ], workers => 1);
    $g = $p;
    $dir = $p->t->prefix;
    my $pp = $p->t->port(0);
    my @long = grep { $_->{kind} =~ /cached/ && !$_->{stream} } Kvgate::Load::catalog();
    my $lrefs = Kvgate::Load::references($pp, \@long);
    my $st = $p->status;
    note("pool: $st->{kv}{blocks_total} blocks");
    $round++;
    my $h = { stop => "$dir/stop", files => [], pids => [] };
    for my $i (1 .. 6) {
        push @{ $h->{files} }, "$dir/pool-$i.txt";
        push @{ $h->{pids} }, Kvgate::Load::spawn_client($pp, \@long, $lrefs, out => "$dir/pool-$i.txt",
            stop => $h->{stop}, seed => $i, detail => "$dir/detail-$round.txt", timeout => 30);
    }
    ok(wait_answers($h, 30, 0, '30 right answers from the small pool'),
       'six clients, long prompts, a pool for two: right answers');
    my @r = stop_load($h);
    check_allowed(\@r, qr/^(?:ok|err:rate_limit_exceeded|err:engine_unavailable)$/, '  or 429/503');
    ok(!(grep { $_->{verdict} =~ /^err:/ && $_->{status} !~ /^(?:429|503)$/ } @r), '  each refusal a 429 or 503');
    $p->stop;
}

done_testing;
