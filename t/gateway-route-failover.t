#!/usr/bin/perl
# An engine that dies with requests in it that have had no token yet: another engine of
# the group takes them, and the clients get their whole answers, as if routed there first.
#
# Two stories260K engines behind one `kvgate_engines` block. Both are stopped (SIGSTOP),
# so that a request routed to one waits in its ring; the gateway counts the routing at
# once (kvgate_route_requests_total), which names the engine that has it. That engine is
# killed and the other resumed: the request (plain, then a stream) must answer 200 with
# exactly the completion the surviving engine gives the same prompt, and the error log
# says where it went. With no engine left to take it, the client gets a clear 503.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep time);
use Kvgate::Gateway;

# (stall => 'off': the engines are stopped to hold a request in a ring, however long that
# takes; t/gateway-route-stall.t is about stopped engines)
my $g = Kvgate::Gateway->new(engines => [ { name => 'a' }, { name => 'b' } ], group => 'route prefix;',
                             stall => 'off');
my $t = $g->t;
my %other = (a => 'b', b => 'a');

sub routed {
    my ($m) = @_;
    my %n;
    $n{$1} += $2 while $m =~ /^kvgate_route_requests_total\{engine="(\w+)",reason="\w+"\} (\d+)$/mg;
    return \%n;
}

# Sends a request on its own connection without waiting for the answer.
sub send_async {
    my ($body) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port(0), Proto => 'tcp',
                                  Timeout => 5) or die "connect: $!";
    my $json = encode_json($body);
    print $s "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           . "X-Tenant-Id: acme\r\nContent-Length: " . length($json) . "\r\nConnection: close\r\n\r\n$json";
    return $s;
}

sub read_answer {
    my ($s) = @_;
    my ($buf, $sel, $deadline) = ('', IO::Select->new($s), time + 30);
    while (time < $deadline) {
        next unless $sel->can_read(0.5);
        my $got = sysread($s, my $chunk, 65536);
        last unless $got;
        $buf .= $chunk;
    }
    close $s;
    my ($head, $body) = split /\r\n\r\n/, $buf, 2;
    my ($status) = ($head // '') =~ m{^HTTP/1\.1 (\d+)};
    if (($head // '') =~ /Transfer-Encoding: chunked/i) {
        my $plain = '';
        while ($body =~ s/^([0-9a-fA-F]+)\r\n//) {
            my $n = hex $1;
            last if $n == 0;
            $plain .= substr($body, 0, $n, '');
            $body =~ s/^\r\n//;
        }
        $body = $plain;
    }
    return ($status // 0, $body // '');
}

# Stops both engines (SIGSTOP) and sends one request: it waits in the ring of the engine
# it was routed to, which the gateway's routing counter names at once. Returns (socket,
# that engine's name).
sub route_to_stopped {
    my ($body) = @_;
    my $before = routed($g->metrics);
    $g->engine_named($_)->signal('STOP') for qw(a b);
    my $s = send_async($body);
    my $victim;
    $g->wait_metrics(sub {
        my $now = routed($_[0]);
        ($victim) = grep { ($now->{$_} // 0) > ($before->{$_} // 0) } qw(a b);
        defined $victim;
    }, 'the request routed');
    return ($s, $victim);
}

# The engine that got the request is killed, the other resumed. Returns (engine killed,
# status, body).
sub fail_over {
    my ($s, $victim) = route_to_stopped(@_);
    $g->engine_named($victim)->kill('KILL');
    $g->engine_named($other{$victim})->signal('CONT');
    my ($status, $text) = read_answer($s);
    return ($victim, $status, $text);
}

my $prompt = join ' ', ('Once upon a time there was a little girl named Lily.') x 10;
my $req = { model => 'stories260K', prompt => $prompt, max_tokens => 12, temperature => 0 };

# the answer every engine gives this prompt
my $ref = $g->post('/v1/completions', $req, 'X-Tenant-Id' => 'acme');
is($ref->{status}, 200, 'the reference answer: 200');
my $want = $ref->{json}{choices}[0]{text};

{
    my ($victim, $status, $body) = fail_over($req);
    my $j = eval { decode_json($body) } // {};
    is($status, 200, "engine $victim killed with the request in it: 200 from the other");
    is($j->{choices}[0]{text}, $want, '  the same completion as the reference');
    ok($g->wait_log(qr/^200 t=acme .* e=$other{$victim}$/), "  \$kvgate_engine says $other{$victim}");
    ok($t->wait_for(sub { $t->read_file('logs/error.log') =~ /engine "$victim" failed the request before its first token .*: sent to engine "$other{$victim}" instead/ },
                    'the reroute logged', 10),
       '  the error log says where it went');
    $g->engine_named($victim)->restart;
    ok($g->wait_status(sub { (grep { $_->{up} && $_->{workers_connected} >= 2 } @{ $_[0]{engines} }) == 2 },
                       'both engines up'), "  engine $victim restarted and back");
}

{
    my ($victim, $status, $body) = fail_over({ %$req, stream => JSON::PP::true });
    my @events = map { /^data: (.*)$/ ? $1 : () } split /\n/, $body;
    my $text = join '', map { my $e = eval { decode_json($_) }; $e ? ($e->{choices}[0]{text} // '') : '' }
                        grep { $_ ne '[DONE]' } @events;
    is($status, 200, "a stream, engine $victim killed: 200");
    is($text, $want, '  the streamed text is the reference completion');
    is($events[-1], '[DONE]', '  ending in [DONE]');
    unlike($body, qr/"error"/, '  with no error event');
    $g->engine_named($victim)->restart;
    ok($g->wait_status(sub { (grep { $_->{up} && $_->{workers_connected} >= 2 } @{ $_[0]{engines} }) == 2 },
                       'both engines up'), "  engine $victim back");
}

{
    # Both stopped, the one with the request killed, the other killed too: nothing can
    # take it.
    my ($s, $victim) = route_to_stopped($req);
    # the other one first, and seen down by the gateway: then the victim
    $g->engine_named($other{$victim})->kill('KILL');
    ok($g->wait_status(sub { grep { $_->{name} eq $other{$victim} && !$_->{up} && !$_->{workers_connected} }
                                  @{ $_[0]{engines} } },
                       "engine $other{$victim} down"), "engine $other{$victim} killed, seen down by every worker");
    $g->engine_named($victim)->kill('KILL');
    my ($status, $body) = read_answer($s);
    my $j = eval { decode_json($body) } // {};
    is($status, 503, 'both engines killed: 503');
    is($j->{error}{code}, 'engine_unavailable', '  engine_unavailable');
    like($j->{error}{message} // '', qr/engine "$victim" failed the request \(kvgate engine connection lost: .*\) and no other engine of "pool" can take it/,
         "  saying why: $j->{error}{message}");
}

my ($clean, @bad) = $g->finish;
ok($clean, 'no alerts, crashes or sanitizer reports') or diag(join "\n", @bad);

done_testing;
