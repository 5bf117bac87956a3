#!/usr/bin/perl
# Reloads lose nothing: 10 `nginx -s reload`s while 300 keep-alive clients send
# completions without a pause. A new worker accepts connections before its handshake
# with the engine is done; the requests it gets meanwhile wait for the handshake
# (kvgate_connect_wait) instead of being refused with 503. Every answer must be a
# 200 with the text the prompt gives alone.
#
# A client whose reused keep-alive connection is closed before any byte of an answer
# (an old worker closing its idle connections as it quits, the race every HTTP
# client knows) sends the request again on a new connection: nginx never read it.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Errno qw(EINTR);
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use POSIX ();
use Test::More;
use Time::HiRes qw(sleep time);
use Kvgate::Gateway;

my $CLIENTS = 300;
my $RELOADS = 10;
my $WORKERS = 4;   # 4 x 256 worker_connections hold 300 clients with room

# (--max-waiting: all 300 may wait in the engine at once, a 429 is not what is tested)
my $g = Kvgate::Gateway->new(workers => $WORKERS, http => 'kvgate_connect_wait 5s;',
                             engine => [ '--max-waiting', '1024' ]);
my $json = JSON::PP->new->canonical;
my $dir = $g->t->prefix;
my $port = $g->t->port(0);

my @prompts = ('Once upon a time', 'The little dog', 'Lily and Tom went to the park');
my @want;
my @bodies;
for my $p (@prompts) {
    my $req = { model => $Kvgate::Gateway::MODEL, prompt => $p, max_tokens => 4, temperature => 0 };
    my $text = $g->completion($req)->{json}{choices}[0]{text};
    ok(defined $text, "'$p' alone: '" . ($text // '') . "'");
    push @want, $text;
    push @bodies, $json->encode($req);
}

# One response from a keep-alive connection: (status, headers, body), or () when the
# connection closed before any byte of it; dies on a partial response or a timeout.
sub read_response {
    my ($s, $buf, $deadline) = @_;
    my $sel = IO::Select->new($s);
    my ($head, $status, $len);
    while (1) {
        if (!defined $head && $$buf =~ s/\A(HTTP\/1\.1 (\d{3})[^\r\n]*\r\n(.*?)\r\n)\r\n//s) {
            ($head, $status) = ($3, $2);
            ($len) = $head =~ /^Content-Length:\s*(\d+)/mi;
            die "no Content-Length in '$head'\n" unless defined $len;
        }
        if (defined $head && length $$buf >= $len) {
            my $body = substr($$buf, 0, $len, '');
            return ($status, $head, $body);
        }
        die "timed out reading a response\n" if time > $deadline;
        next unless $sel->can_read(0.5);
        my $n = $s->sysread($$buf, 65536, length $$buf);
        next if !defined $n && $! == EINTR;
        if (!$n) {
            return () if !defined $head && $$buf eq '';
            die "connection closed inside a response\n";
        }
    }
}

sub client {
    my ($i) = @_;
    $SIG{PIPE} = 'IGNORE';
    my %n = (ok => 0, bad => 0, resent => 0);
    my @bad;
    my $stop = "$dir/stop";
    my $deadline = time + 120;
    my ($s, $used, $buf);
    my $k = $i;
    while (!-e $stop && time < $deadline) {
        my $j = $k++ % @prompts;
        if (!$s) {
            $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Proto => 'tcp',
                                       Timeout => 5);
            if (!$s) { push @bad, "connect: $!"; $n{bad}++; sleep 0.05; next }
            ($used, $buf) = (0, '');
        }
        my $ok = $s->syswrite("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                              . "Content-Type: application/json\r\nContent-Length: "
                              . length($bodies[$j]) . "\r\n\r\n$bodies[$j]");
        my @r = defined $ok ? eval { read_response($s, \$buf, time + 30) } : ();
        if ($@) {
            push @bad, "prompt $j: $@";
            $n{bad}++;
            undef $s;
            next;
        }
        if (!@r) {
            # closed before the answer began: on a reused connection, send again
            push @bad, "prompt $j: closed before an answer on a new connection" unless $used;
            $n{$used ? 'resent' : 'bad'}++;
            undef $s;
            next;
        }
        my ($status, $head, $body) = @r;
        my $text = eval { $json->decode($body)->{choices}[0]{text} };
        if ($status == 200 && defined $text && $text eq $want[$j]) {
            $n{ok}++;
        } else {
            $n{bad}++;
            push @bad, "prompt $j: $status " . substr($body, 0, 200);
        }
        $used = 1;
        undef $s if $head =~ /^Connection:\s*close/mi;
    }
    open my $fh, '>', "$dir/client$i.txt" or POSIX::_exit(1);
    print $fh "$n{ok} $n{bad} $n{resent}\n", map { "$_\n" } @bad[0 .. ($#bad < 4 ? $#bad : 4)];
    close $fh;
    POSIX::_exit(0);
}

my @pids;
for my $i (1 .. $CLIENTS) {
    my $pid = fork // die "fork: $!";
    client($i) if !$pid;
    push @pids, $pid;
}

# all clients at work before the first reload
my $served = sub {
    my ($m) = @_;
    my $n = 0;
    $n += $1 while $m =~ /^kvgate_requests_total\{endpoint="completions",[^}]*status="200"\} (\d+)$/mg;
    return $n;
};
my $start = $served->($g->metrics);
ok($g->t->wait_for(sub { $served->($g->metrics) >= $start + 2 * $CLIENTS }, 'the clients at work', 60),
   "$CLIENTS clients at work");

my $connected = $WORKERS;
for my $k (1 .. $RELOADS) {
    kill 'HUP', $g->t->{pid};
    $connected += $WORKERS;
    # each new worker says so once connected; then some load on the new workers
    my @l = $g->t->wait_log('logs/error.log', qr/kvgate: connected to the engine/, count => $connected,
                            timeout => 30);
    ok(scalar @l, "reload $k: $WORKERS new workers connected");
    my $at = $served->($g->metrics);
    $g->t->wait_for(sub { $served->($g->metrics) >= $at + $CLIENTS }, "requests after reload $k", 30);
}

$g->t->write_file('stop', '');
waitpid $_, 0 for @pids;

my ($ok, $bad, $resent) = (0, 0, 0);
my @why;
for my $i (1 .. $CLIENTS) {
    my ($line, @b) = split /\n/, $g->t->read_file("client$i.txt");
    my ($o, $x, $r) = split / /, $line // '0 1 0';
    $ok += $o;
    $bad += $x;
    $resent += $r;
    push @why, @b;
}
cmp_ok($ok, '>', $CLIENTS * $RELOADS, "$ok answers, each 200 with its prompt's text");
is($bad, 0, 'no answer other than that (no 503 while a new worker shakes hands)')
    or diag(join "\n", @why[0 .. ($#why < 20 ? $#why : 20)]);
note("$resent requests sent again after an old worker closed an idle connection");

# ---- the workers-connected gauge cannot drift ---------------------------------------------
#
# It is derived from what is alive, never summed: after the reloads, after an old worker
# that lingers on a request is killed (nobody is respawned into its slot) and after a
# current worker is killed (its successor takes its slot), it equals the number of
# worker processes.

# The master's children (its worker processes).
sub workers {
    my @w;
    for my $stat (glob '/proc/[0-9]*/stat') {
        my $text = do { local $/; open my $fh, '<', $stat or next; <$fh> } // next;
        push @w, $1 if $text =~ /^(\d+) \(.*\) \S+ (\d+) / && $2 == $g->t->{pid};
    }
    return sort { $a <=> $b } @w;
}

sub gauge_is {
    my ($n, $what) = @_;
    my ($gauge, $clients, $procs);
    $g->t->wait_for(sub {
        my $s = $g->status or return 0;
        ($gauge, $clients, $procs) = ($s->{gateway}{workers_connected}, $s->{engine}{clients},
                                      scalar(() = workers()));
        $gauge == $n && $procs == $n
            && $g->metric($g->metrics, 'kvgate_engine_workers_connected') == $n;
    }, "$n workers connected: $what", 30);
    # (the engine's own client count is no check: its statistics page is refreshed
    # while it works, so an idle engine's page can lag behind)
    is($gauge, $n, "$what: workers_connected $n ($procs worker processes; the engine's "
                   . "page said $clients clients)");
}

gauge_is($WORKERS, "after $RELOADS reloads");

# (the engine's log says so; error.log must not keep the kills' alerts)
my @killed;
sub forget_kills {
    my $log = $g->t->read_file('logs/error.log');
    my $re = join '|', @killed;
    $log =~ s/^[^\n]*worker process (?:$re) exited on signal 9\n//mg;
    $g->t->write_file('logs/error.log', $log);
}

{
    # a body that never ends keeps an old worker alive through the next reload
    my @old = workers();
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Proto => 'tcp')
        or die "connect: $!";
    $s->syswrite("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{");
    $connected += $WORKERS;
    kill 'HUP', $g->t->{pid};
    $g->t->wait_log('logs/error.log', qr/kvgate: connected to the engine/, count => $connected,
                    timeout => 30);
    my %old = map { $_ => 1 } @old;
    my @left;
    $g->t->wait_for(sub { @left = grep { $old{$_} } workers(); @left == 1 }, 'one old worker left', 30);
    is(scalar @left, 1, 'a reload while a body is being read: one old worker stays');
    gauge_is($WORKERS + 1, '  with it');
    kill 'KILL', @left;
    push @killed, @left;
    gauge_is($WORKERS, '  once it is killed (its slot is not reused)');
    close $s;
}

{
    my ($victim) = workers();
    kill 'KILL', $victim;
    push @killed, $victim;
    $g->t->wait_for(sub { !grep { $_ == $victim } workers() }, 'the killed worker gone', 30);
    gauge_is($WORKERS, 'a current worker killed and respawned');
}

forget_kills();

$g->stop;

# (the access log is complete once nginx has quit)
my @other = grep { !/^200 / } split /\n/, $g->t->read_file('logs/kvgate.log');
is(scalar @other, 0, 'the access log has nothing but 200s') or diag(join "\n", @other[0 .. 9]);

done_testing;
