#!/usr/bin/perl
# The gateway when things go wrong: a client that disconnects mid-stream has its
# request stopped in the engine; an engine killed mid-stream ends the stream with a
# clean error, nginx keeps serving (503 + Retry-After while the engine is away) and
# requests succeed again once an engine is back, even one serving another model name;
# `nginx -s quit` lets in-flight requests finish.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Select;
use IO::Socket::INET;
use IO::Socket::UNIX;
use JSON::PP;
use POSIX qw(WNOHANG);
use Test::More;
use Time::HiRes qw(sleep time);
use Kvgate::Gateway;
use Kvgate::Test;
use Socket qw(SOCK_SEQPACKET);

my $g = Kvgate::Gateway->new(locations => <<'EOF');
        location = /plain {
            return 200 "plain\n";
        }
EOF

my $long = { prompt => 'Once upon a time', n => 16, max_tokens => 480, temperature => 1.0, seed => 1 };

# Reads until the first SSE event has arrived; returns what was read.
sub read_first_event {
    my ($s) = @_;
    my $sel = IO::Select->new($s);
    my $buf = '';
    my $deadline = time + 20;
    while (time < $deadline && $buf !~ /data: \{.*\n\n/s) {
        next unless $sel->can_read(0.1);
        my $n = $s->sysread($buf, 4096, length $buf);
        last unless $n;
    }
    return $buf;
}

sub wait_until {
    my ($cond, $timeout, $what) = @_;
    return $g->t->wait_for($cond, $what, $timeout // 10);
}

# ---- a client leaves mid-stream ---------------------------------------------------------

{
    my $before = $g->status->{scheduler};
    my $s = $g->send_raw('/v1/completions', { model => 'stories260K', %$long, stream => JSON::PP::true });
    my $got = read_first_event($s);
    like($got, qr{^HTTP/1\.1 200}, 'a long streamed request starts');
    close $s;
    my $t0 = time;
    my $st;
    # (the statistics page is refreshed at least every 20 ms while the engine works, and
    # whenever a request ends: wait for the cancel to show, not just for an idle page)
    ok(wait_until(sub { $st = $g->status->{scheduler};
                        $st->{client_cancels} == $before->{client_cancels} + 1
                            && $st->{running} == 0 && $st->{waiting} == 0 }),
       sprintf('the client hangs up: the gateway cancels, the engine stops the request (%.0f ms)',
               (time - $t0) * 1000));
    is($st->{cancelled}, $before->{cancelled} + 1, '  cancelled in the scheduler, not finished');
    ok($st->{decode_tokens} - $before->{decode_tokens} < 16 * 480 - 16,
       '  long before its end (' . ($st->{decode_tokens} - $before->{decode_tokens}) . ' of 7680 tokens)');
    # (counted in the log phase, which need not have run when the engine shows the cancel)
    my $series = 'kvgate_requests_total{endpoint="completions",bucket="bypass",status="499"}';
    my $m = $g->wait_metrics(sub { $g->metric($_[0], $series) >= 1 }, "$series counted");
    ok($g->metric($m, $series) == 1, '  counted as status 499 in the metrics');
}

# ---- nginx -s quit drains -----------------------------------------------------------------

my $quit_file = $g->t->prefix . '/drained.txt';
{
    my $pid = fork // die;
    if (!$pid) {
        my $s = $g->send_raw('/v1/completions', { model => 'stories260K', %$long, max_tokens => 200,
                                                   stream => JSON::PP::true });
        my $raw = $g->read_all($s, 60);
        open my $fh, '>', $quit_file or POSIX::_exit(1);
        print $fh $raw;
        close $fh;
        POSIX::_exit(0);
    }
    ok(wait_until(sub { (($g->status // {})->{scheduler} // {})->{running} }, 20, 'the stream to run in the engine'),
       'a long stream runs');
    kill 'QUIT', $g->t->{pid};
    waitpid $pid, 0;
    my ($status, $h, $body) = $g->parse_http($g->t->read_file($quit_file));
    my @ev = $g->sse_events($body);
    is($status, 200, 'nginx -s quit during a stream: the stream goes on');
    is($ev[-1], 'DONE', '  to its end ([DONE])');
    my @texts = $g->stream_texts(\@ev);
    is(scalar(grep { length } @texts), 16, '  with all 16 choices');
    my $nginx_pid = $g->t->{pid};
    ok(wait_until(sub { waitpid($nginx_pid, WNOHANG) == $nginx_pid }, 20, 'nginx to exit'), '  then nginx exits');
    $g->t->{pid} = undef;
    ok(!grep({ /\[alert\]|\[emerg\]|open socket/ } split /\n/, $g->t->read_file('logs/error.log')),
       '  with no alerts (no "open socket left")');
}

# A fresh nginx on the same engine for the rest.
$g->t->run;
$g->wait_up;

# ---- the engine dies mid-stream ------------------------------------------------------------

{
    my $s = $g->send_raw('/v1/completions', { model => 'stories260K', %$long, stream => JSON::PP::true });
    my $got = read_first_event($s);
    $g->engine->kill('KILL');
    my $t0 = time;
    $got .= $g->read_all($s, 10);
    my $dt = time - $t0;
    close $s;
    my ($status, $h, $body) = $g->parse_http($got);
    my @ev = $g->sse_events($body);
    is($status, 200, 'engine killed mid-stream: the stream had begun');
    my $last = $ev[-1];
    ok(ref $last && $last->{error}, '  it ends with an error event');
    is($last->{error}{code}, 'engine_unavailable', '  engine_unavailable');
    like($last->{error}{message}, qr/connection lost/, "  '$last->{error}{message}'");
    ok($dt < 2, sprintf('  at once (%.0f ms)', $dt * 1000));

    my $r = $g->completion({ prompt => 'Once upon a time', max_tokens => 4 });
    is($r->{status}, 503, 'while the engine is away: 503');
    is($r->{headers}{'retry-after'}, 1, '  Retry-After: 1');
    is($r->{json}{error}{code}, 'engine_unavailable', '  engine_unavailable');
    is($g->t->get('/plain')->{body}, "plain\n", 'nginx keeps serving everything else');
    is($g->t->get('/v1/models')->{status}, 503, '/v1/models: 503 too');
    # (each worker notices the lost engine on its own; the scrape may be the other one's)
    like($g->wait_metrics(sub { $_[0] =~ /^kvgate_engine_up 0$/m }, 'kvgate_engine_up 0'),
         qr/^kvgate_engine_up 0$/m, 'kvgate_engine_up 0');

    $g->engine->restart;
    ok(wait_until(sub { $g->completion({ prompt => 'Once upon a time', max_tokens => 4 })->{status} == 200 }, 15),
       'the engine restarts: requests succeed again');
    $g->wait_up;
    like($g->wait_metrics(sub { $_[0] =~ /^kvgate_engine_up 1$/m }, 'kvgate_engine_up 1'),
         qr/^kvgate_engine_up 1$/m, 'kvgate_engine_up 1');

    # Another model name on the next engine: the gateway follows it.
    $g->engine->stop;
    $g->engine->restart(extra => [ '--served-model-name', 'tiny-stories' ]);
    ok(wait_until(sub { ($g->t->get('/v1/models')->{json}{data}[0]{id} // '') eq 'tiny-stories' }, 15),
       'an engine with another model name: /v1/models follows');
    $g->wait_up;
    is($g->completion({ prompt => 'x', max_tokens => 2 })->{status}, 404, '  the old name: 404');
    is($g->post('/v1/completions', { model => 'tiny-stories', prompt => 'x', max_tokens => 2 })->{status}, 200,
       '  the new name: 200');
}

$g->stop;

# ---- a full submission ring: requests wait in the worker, in order ------------------------

{
    # (stall => 'off': the engine is stopped to hold the requests, however long that takes)
    my $q = Kvgate::Gateway->new(engine => [ '--sq-data', '4096' ], workers => 1, stall => 'off');
    my $doc = join ' ', ('Lily and Tom went to the park with their big red ball.') x 20;
    my $body = { prompt => substr($doc, 0, 900), max_tokens => 8, temperature => 0 };
    my $want = $q->completion($body, 'X-Tenant-Id' => 'ring')->{json}{choices}[0]{text};
    # The engine stops taking submissions (SIGSTOP): two fit in its 4 KiB area, the
    # others must wait in the worker until it goes on.
    kill 'STOP', $q->engine->pid;
    my $dir = $q->t->prefix;
    my @pids;
    for my $i (1 .. 12) {
        my $pid = fork // die;
        if (!$pid) {
            # (headers and body in one write: see wait_in_nginx)
            my $sock = $q->send_raw('/v1/completions', { model => $Kvgate::Gateway::MODEL, %$body },
                                    'X-Tenant-Id' => 'ring');
            my ($status, undef, $json) = $q->parse_http($q->read_all($sock, 60));
            my $text = eval { JSON::PP->new->decode($json)->{choices}[0]{text} };
            open my $fh, '>', "$dir/q$i.txt" or POSIX::_exit(1);
            print $fh "$status\n", $text // '';
            close $fh;
            POSIX::_exit(0);
        }
        push @pids, $pid;
    }
    # Once all 12 are in the (one) worker, each was submitted or queued: the count is final.
    is($q->wait_in_nginx(12, 20), 12, 'twelve requests in nginx while the engine is stopped');
    my $waits = $q->metric($q->metrics, 'kvgate_submit_waits_total');
    kill 'CONT', $q->engine->pid;
    waitpid $_, 0 for @pids;
    my $same = grep { $q->t->read_file("q$_.txt") eq "200\n$want" } 1 .. 12;
    ok($waits >= 9, "the engine stopped: $waits requests wait for room in the submission ring");
    is($same, 12, '  once it goes on, all 12 are answered, each with the right text');
    $q->stop;
}

# ---- an engine that takes the connection but never finishes the handshake ---------------
#
# Requests wait for the handshake at most kvgate_connect_wait (from the worker's start: the
# first request may come before its end or after), then get the usual 503 with
# Retry-After, saying why; later ones get it at once.

{
    my $t = Kvgate::Test->new;
    my $sock = $t->prefix . '/mute.sock';
    my $listen = IO::Socket::UNIX->new(Type => SOCK_SEQPACKET(), Local => $sock, Listen => 16)
        or die "listen: $!";
    chmod 0777, $sock;
    $t->spawn(sub {
        my @held;
        while (my $c = $listen->accept) { push @held, $c }   # accepted, never answered
    });
    close $listen;
    $t->write_config(http => <<"EOF");
    kvgate_engine unix:$sock;
    kvgate_connect_wait 1s;
    server {
        listen 127.0.0.1:%%PORT%%;
        location /v1/ { kvgate_pass; }
    }
EOF
    $t->run;
    my $req = '{"model":"m","prompt":"Once upon a time","max_tokens":4}';
    my $t0 = time;
    my $r = $t->post_json('/v1/completions', $req);
    my $dt = time - $t0;
    is($r->{status}, 503, 'a handshake that never finishes: 503');
    is($r->{headers}{'retry-after'}, 1, '  Retry-After: 1');
    is($r->{json}{error}{code}, 'engine_unavailable', '  engine_unavailable');
    like($r->{json}{error}{message} // '', qr/engine is not available \(the handshake did not finish within 1000 ms\)/,
         "  '" . ($r->{json}{error}{message} // '') . "'");
    ok($dt < 3, sprintf('  after the rest of the wait at most (%.0f ms)', $dt * 1000));
    $t0 = time;
    $r = $t->post_json('/v1/completions', $req);
    is($r->{status}, 503, '  the next request: 503');
    ok(time - $t0 < 0.3, sprintf('  at once (%.0f ms)', (time - $t0) * 1000));
    ok($t->wait_log('logs/error.log', qr/handshake did not finish within 1000 ms/), '  the wait is logged');
    $t->stop;
}

# ---- a body that stalls past client_body_timeout: the documented OpenAI 408 --------------

{
    my $b = Kvgate::Gateway->new(server => 'client_body_timeout 300ms;', workers => 1);
    my $body = '{"model":"stories260K","prompt":"Once upon a time","max_tokens":4}';
    my $n = 0;
    for my $framing ('content-length', 'chunked') {
        $n++;
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $b->t->port(0),
                                      Proto => 'tcp', Timeout => 5) or die "connect: $!";
        my $head = "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n";
        $s->syswrite($framing eq 'chunked'
                     ? $head . "Transfer-Encoding: chunked\r\n\r\n10\r\n" . substr($body, 0, 10)
                     : $head . 'Content-Length: ' . length($body) . "\r\n\r\n" . substr($body, 0, 10));
        # the rest never comes; the answer does, and then the connection closes
        my $t0 = time;
        my $raw = $b->read_all($s, 20);
        my $dt = time - $t0;
        close $s;
        my ($status, $h, $text) = $b->parse_http($raw);
        is($status, 408, "a stalled body ($framing): 408");
        is($h->{'content-type'}, 'application/json', '  JSON');
        is($h->{connection}, 'close', '  Connection: close');
        my $e = eval { JSON::PP->new->decode($text)->{error} } // {};
        is($e->{type}, 'invalid_request_error', '  an OpenAI error object');
        like($e->{message} // '', qr/client_body_timeout/, "  '" . ($e->{message} // '') . "'");
        note(sprintf('  answered and closed after %.0f ms', $dt * 1000));
        ok($b->wait_log(qr/^408 /, count => $n), '  logged as 408');
    }
    is($b->completion({ prompt => 'Once upon a time', max_tokens => 4 })->{status}, 200,
       '  the next request is served');
    $b->stop;
}

done_testing;
