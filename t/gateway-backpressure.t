#!/usr/bin/perl
# Backpressure for slow readers (kvgate_max_unsent): 64 streams whose clients do not
# read cost the worker a bounded amount of memory each, the engine stops generating
# for them (paused: held with their blocks) while other requests are served as usual;
# once the clients read, every stream completes with exactly the text of a solo run;
# a client that never reads is closed at send_timeout (408) and its request cancelled
# in the engine, its blocks freed.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use Socket qw(SOL_SOCKET SO_RCVBUF inet_aton pack_sockaddr_in);
use Test::More;
use Time::HiRes qw(sleep time);
use Kvgate::Gateway;
use Kvgate::Test;

my $N = 64;
my $asan = Kvgate::Test::asan();

# One worker, so every stream is in the worker whose memory is measured. The second
# server fixes the kernel's send buffer (sndbuf= turns off its autotuning, which on
# loopback grows to megabytes): the output then waits in the worker, where the bound
# applies, instead of in the kernel. 128 samples run at once (--max-running: a paused
# request keeps its place among the running).
#
# Whether a stream pauses before it ends must not depend on how the machine schedules
# the worker and the engine. What reaches the worker after it decided to pause is
# bounded by the engine, not by timing: a sample never runs more than
# --max-unread-tokens tokens ahead of what the worker has read (16 here: with n = 2,
# under 6 KB of SSE), however long the worker is kept from running. Before a pause the
# client's part of a stream sits in the kernel's buffers (16k sndbuf, 4k rcvbuf, each
# doubled by the kernel: at most 40 KB) and in the worker (kvgate_max_unsent 32k, and
# the chunk that crossed it, 4 KB): at most about 82 KB in all. Every stream below has
# more than that left when its client stops reading, so it pauses, on any machine.
my $g = Kvgate::Gateway->new(workers => 1, engine => ['--max-running', '256', '--max-unread-tokens', '16'],
                             http => <<'EOF');
    server {
        listen 127.0.0.1:%%PORT_1%% sndbuf=16k;
        kvgate_max_unsent 32k;
        location /v1/ {
            kvgate_pass;
        }
        location /short/v1/ {
            kvgate_pass;
            send_timeout 1500ms;
        }
    }
EOF

my $port = $g->t->port(1);
my $body = { model => 'stories260K', prompt => 'Once upon a time', n => 2, max_tokens => 480,
             temperature => 0, stream => JSON::PP::true };

# A client socket with a small receive buffer (set before connecting, so the window it
# announces is small from the start) that sends one request.
sub slow_client {
    my ($path, $b) = @_;
    my $s = IO::Socket::INET->new(Proto => 'tcp') or die "socket: $!";
    setsockopt($s, SOL_SOCKET, SO_RCVBUF, 4096) or die "SO_RCVBUF: $!";
    $s->connect(pack_sockaddr_in($port, inet_aton('127.0.0.1'))) or die "connect: $!";
    my $json = JSON::PP->new->canonical->encode($b);
    $s->syswrite("POST $path HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 . "Content-Length: " . length($json) . "\r\nConnection: close\r\n\r\n$json");
    return $s;
}

# Reads every socket until each one's EOF (or the deadline); the bytes of each.
sub read_all_of {
    my ($socks, $timeout) = @_;
    my %buf = map { ($_ => '') } 0 .. $#$socks;
    my %fh = map { (fileno($socks->[$_]) => $_) } 0 .. $#$socks;
    my $sel = IO::Select->new(@$socks);
    my $deadline = time + $timeout;
    while ($sel->count && time < $deadline) {
        for my $s ($sel->can_read(0.2)) {
            my $i = $fh{ fileno $s };
            my $n = $s->sysread($buf{$i}, 65536, length $buf{$i});
            $sel->remove($s) unless $n;
        }
    }
    return map { $buf{$_} } 0 .. $#$socks;
}

sub texts_of {
    my ($raw) = @_;
    my ($status, $h, $b) = $g->parse_http($raw);
    my @ev = $g->sse_events($b);
    return ($status, (@ev && $ev[-1] eq 'DONE') ? 1 : 0, [ $g->stream_texts(\@ev) ]);
}

sub worker_pid {
    my $master = $g->t->{pid};
    for my $stat (glob '/proc/[0-9]*/stat') {
        open my $fh, '<', $stat or next;
        my $line = <$fh> // next;
        my ($pid, $ppid) = $line =~ /^(\d+) \(.*\) \S (\d+)/ or next;
        return $pid if $ppid == $master;
    }
    return undef;
}

sub rss_kb {
    my ($pid) = @_;
    open my $fh, '<', "/proc/$pid/status" or return 0;
    while (<$fh>) {
        return $1 if /^VmRSS:\s+(\d+) kB/;
    }
    return 0;
}

# ---- solo references ---------------------------------------------------------------------

my $ref_raw = $g->read_all(slow_client('/v1/completions', $body), 60);
my ($ref_status, $ref_done, $ref) = texts_of($ref_raw);
is($ref_status, 200, 'a solo stream (n=2, 480 tokens, temperature 0)');
ok($ref_done && length($ref->[0]) > 500 && length($ref->[1]) > 500,
   sprintf('  complete ([DONE]), %d and %d bytes of text', length($ref->[0]), length($ref->[1])));
my $plain = { prompt => 'The little dog', max_tokens => 40, temperature => 0 };
my $plain_ref = $g->completion($plain);
is($plain_ref->{status}, 200, 'a solo non-streamed request');
my $plain_text = $plain_ref->{json}{choices}[0]{text};
# (once more, so the worker's pools and caches have grown to what one stream needs)
texts_of($g->read_all(slow_client('/v1/completions', $body), 60));

my $worker = worker_pid();
ok($worker, "the worker process ($worker)");
my $rss0 = rss_kb($worker);
my $st0 = $g->status->{scheduler};

# ---- 64 streams that do not read ------------------------------------------------------

my @socks = map { slow_client('/v1/completions', $body) } 1 .. $N;
my $st = $g->wait_status(sub { $_[0]{scheduler}{paused} == $N }, "$N streams paused", $asan ? 120 : 60)
    ->{scheduler};
is($st->{paused}, $N, "$N streams whose clients do not read are paused in the engine");
ok($st->{held} >= $N && $st->{running} == $N, "  held with their places (held $st->{held}, running $st->{running})");
is($st->{pauses} - $st0->{pauses}, $N, '  each paused once');
my $kv = $g->status->{kv};
ok($kv->{used} >= $N, "  keeping their blocks ($kv->{used} in use)");

# Nothing of theirs is computed any more: the decode count stands still.
my $d1 = $st->{decode_tokens};
sleep 0.5;
my $d2 = $g->status->{scheduler}{decode_tokens};
is($d2, $d1, "  the engine no longer generates for them ($d1 decode tokens, still $d2 0.5 s later)");

my $grown = rss_kb($worker) - $rss0;
my $bound = 64 * $N * ($asan ? 8 : 1);
ok($grown <= $bound, sprintf('  the worker grew by %d KB for %d streams (%.1f KB each; bound %d KB each%s)',
                             $grown, $N, $grown / $N, $bound / $N, $asan ? ', ASan' : ''));

# Everyone else is served meanwhile.
my $r = $g->completion($plain);
is($r->{status}, 200, 'meanwhile another request is served');
is($r->{json}{choices}[0]{text}, $plain_text, '  with the text of its solo run');

# ---- the clients read ---------------------------------------------------------------

my @raw = read_all_of(\@socks, $asan ? 240 : 120);
close $_ for @socks;
my ($ok200, $complete, $same) = (0, 0, 0);
for my $raw (@raw) {
    my ($status, $done, $texts) = texts_of($raw);
    $ok200++ if $status == 200;
    $complete++ if $done;
    $same++ if $texts->[0] eq $ref->[0] && $texts->[1] eq $ref->[1];
}
is($ok200, $N, "the clients read: all $N streams answered 200");
is($complete, $N, '  all complete ([DONE])');
is($same, $N, '  every one with exactly the text of the solo run');
$st = $g->wait_status(sub { $_[0]{scheduler}{paused} == 0 && $_[0]{scheduler}{running} == 0 },
                      'nothing paused or running')->{scheduler};
ok($st->{paused} == 0 && $st->{resumes} - $st0->{resumes} >= $N,
   "  resumed as they drained (resumes +" . ($st->{resumes} - $st0->{resumes}) . ', none paused now)');
my $m = $g->wait_metrics(sub { $g->metric($_[0], 'kvgate_backpressure_total{event="resume"}') >= $N },
                         'resumes counted');
ok($g->metric($m, 'kvgate_backpressure_total{event="pause"}') >= $N
       && $g->metric($m, 'kvgate_backpressure_total{event="resume"}') >= $N,
   '  the gateway counts the pauses and resumes (kvgate_backpressure_total)');
like($m, qr/^kvgate_engine_paused_requests\{engine="\Q@{[ $g->engine_label ]}\E"\} 0$/m,
     '  and shows the engine\'s paused gauge (0 now)');

# ---- 64 streams read for a third of their length, then not -------------------------
# What a client has taken is not kept in the worker (a stream's buffers are recycled once
# sent): 64 streams, each read normally for a third of its length (about 53 KB) and then
# not, cost the worker little more than ones that never read: the 53 KB each has taken are
# not kept (before recycling they stayed in the request's pool, several times over, > 150 KB
# a stream). Measured once they are all paused again, so nothing depends on timing; the two
# thirds left (about 107 KB) are more than the 82 KB a stream can hand over before it
# pauses (above). The bound is higher than above by what a stream read alone (so run at
# the engine's full speed) receives after its pause was decided: the tokens on their way.

my $third = int(length($ref_raw) / 3);
my @socks2 = map { slow_client('/v1/completions', $body) } 1 .. $N;
my ($read_ok, @first) = (0);
for my $s (@socks2) {
    my $got = '';
    my $sel = IO::Select->new($s);
    my $deadline = time + ($asan ? 60 : 30);
    while (length($got) < $third && time < $deadline) {
        next unless $sel->can_read(0.2);
        my $n = $s->sysread($got, $third - length($got), length $got);
        last unless $n;
    }
    $read_ok++ if length($got) == $third;
    push @first, $got;
}
is($read_ok, $N, "$N streams read for a third of their length ($third bytes each)");
$st = $g->wait_status(sub { $_[0]{scheduler}{paused} == $N }, "$N streams paused again", $asan ? 120 : 60)
    ->{scheduler};
is($st->{paused}, $N, '  then not read: all paused');
$grown = rss_kb($worker) - $rss0;
my $bound2 = 96 * $N * ($asan ? 8 : 1);
ok($grown <= $bound2, sprintf('  the worker has grown by %d KB over its idle size (%.1f KB a stream; bound %d KB%s)',
                              $grown, $grown / $N, $bound2 / $N, $asan ? ', ASan' : ''));
@raw = read_all_of(\@socks2, $asan ? 240 : 120);
close $_ for @socks2;
($ok200, $complete, $same) = (0, 0, 0);
for my $i (0 .. $#raw) {
    my ($status, $done, $texts) = texts_of($first[$i] . $raw[$i]);
    $ok200++ if $status == 200;
    $complete++ if $done;
    $same++ if $texts->[0] eq $ref->[0] && $texts->[1] eq $ref->[1];
}
ok($ok200 == $N && $complete == $N, "  read to the end: all $N answered 200 and complete ([DONE])");
is($same, $N, '  every one with exactly the text of the solo run');
$g->wait_status(sub { $_[0]{scheduler}{paused} == 0 && $_[0]{scheduler}{running} == 0 },
                'nothing paused or running');

# ---- a client that never reads: closed at send_timeout ---------------------------------

{
    my $used0 = $g->status->{kv}{used};
    my $st1 = $g->status->{scheduler};
    my $s = slow_client('/short/v1/completions', $body);
    my $p = $g->wait_status(sub { $_[0]{scheduler}{paused} == 1 }, 'the stream paused')->{scheduler};
    is($p->{paused}, 1, 'a client that never reads: its stream is paused');
    my $t0 = time;
    my $e = $g->wait_status(sub { $_[0]{scheduler}{paused} == 0 && $_[0]{scheduler}{running} == 0
                                  && $_[0]{kv}{used} == $used0 }, 'the request gone from the engine', 20);
    ok($e->{scheduler}{paused} == 0 && $e->{scheduler}{running} == 0 && $e->{kv}{used} == $used0,
       sprintf('  at send_timeout (1.5 s) it is cancelled in the engine and its blocks are free (%.1f s)',
               time - $t0));
    is($e->{scheduler}{client_cancels} - $st1->{client_cancels}, 1, '  by the gateway\'s cancel');
    my $raw = $g->read_all($s, 10);
    close $s;
    my ($status, $done) = texts_of($raw);
    ok($status == 200 && !$done, '  the client finds the connection closed mid-stream (no [DONE])');
    my $series = 'kvgate_requests_total{endpoint="completions",bucket="bypass",status="408"}';
    $m = $g->wait_metrics(sub { $g->metric($_[0], $series) >= 1 }, "$series counted");
    is($g->metric($m, $series), 1, '  counted as 408');
    is($g->metric($m, 'kvgate_backpressure_total{event="send_timeout"}'), 1,
       '  and as a send timeout (kvgate_backpressure_total{event="send_timeout"})');
    ok($g->t->wait_log('logs/access.log', qr{"POST /short/v1/completions HTTP/1.1" 408 }), '  logged 408');
}

$g->t->check_logs('no alerts, crashes or sanitizer reports in error.log');
$g->stop;

done_testing();
