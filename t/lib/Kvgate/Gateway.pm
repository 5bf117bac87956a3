package Kvgate::Gateway;

# A real nginx with the kvgate module in front of a real kvgate-engine, for the
# gateway tests:
#
#   my $g = Kvgate::Gateway->new(http => '...extra http{} lines...',
#                                main => '...extra main-context lines...',
#                                server => '...extra server{} lines...',
#                                engine => [extra engine args],
#                                stall => '500ms');   # kvgate_engine_stall (default: the module's)
#   my $r = $g->completion({prompt => 'Once upon a time', max_tokens => 8});
#   my ($events, $raw) = $g->stream('/v1/chat/completions', {...});
#   my $st = $g->status;               # kvgate_status JSON
#   my $line = $g->wait_log(qr/t=acme/);                   # the access log, when written
#   my $m = $g->wait_metrics(sub { $g->metric($_[0], 'name') >= 1 }, 'name counted');
#   $g->engine_metric($m, 'kvgate_kv_blocks', 'state="free"');   # the engine's own series
#   my $s = $g->wait_status(sub { $_[0]{scheduler}{running} == 0 }, 'the engine idle');
#   $g->stop;                          # QUIT nginx (one test: clean logs), TERM engine
#   my @w = $g->worker_pids;  $g->rss_kb($pid);  $g->worker_connections($pid);
#   my @new = $g->reload;
#   my ($clean, @bad) = $g->finish(qr/exited on signal 9/);   # stop, asserting nothing
#
# The default configuration: `kvgate_engine` on the engine's socket, the tenant from
# X-Tenant-Id, `kvgate_pass` at /v1/, `kvgate_metrics` at /metrics, `kvgate_status` at
# /status (rendered at every read: kvgate_page_refresh 0), nginx's stub_status at
# /nginx_status, an access log with every kvgate variable, and two worker processes.
#
# The access log and the gateway's counters (metrics, the gateway part of /status) are
# written in nginx's log phase, after the response has been sent: read them with the
# wait_* helpers, never once right after a request.

use strict;
use warnings;

use Carp qw(croak);
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep time);

use Kvgate::Engine;
use Kvgate::Test;

our $MODEL = 'stories260K';

sub new {
    my ($class, %o) = @_;
    my $t = Kvgate::Test->new;
    my $self = bless { t => $t, o => \%o }, $class;
    # engines => [{name => 'a', args => [...], extra => [...]}, ...]: several engines
    # in a `kvgate_engines pool { ... $o{group} }` block that /v1/ passes to
    my ($upstream, $pass) = ("kvgate_engine unix:%%PREFIX%%/engine.sock;", 'kvgate_pass;');
    my $elog = $o{engines} ? ' e=$kvgate_engine' : '';
    if ($o{engines}) {
        my $lines = '';
        for my $e (@{ $o{engines} }) {
            $self->{engines}{ $e->{name} } = Kvgate::Engine->start(
                socket => $t->prefix . "/$e->{name}.sock",
                $e->{args} ? (args => $e->{args}) : (), extra => $e->{extra} // []);
            $lines .= "engine unix:%%PREFIX%%/$e->{name}.sock name=$e->{name}; ";
        }
        $self->{engine} = $self->{engines}{ $o{engines}[0]{name} };
        $upstream = "kvgate_engines pool { $lines " . ($o{group} // '') . " }";
        $pass = 'kvgate_pass pool;';
    } else {
        # engine_bin => another kvgate-engine binary (e.g. the emulated CUDA build)
        $self->{engine} = Kvgate::Engine->start(socket => $t->prefix . '/engine.sock',
                                                $o{engine_args} ? (args => $o{engine_args}) : (),
                                                $o{engine_bin} ? (bin => $o{engine_bin}) : (),
                                                extra => $o{engine} // []);
    }
    my $http = $o{http} // '';
    # Tests that stop an engine (SIGSTOP) to hold requests in flight give stall => 'off'.
    $http = "kvgate_engine_stall $o{stall};\n    $http" if defined $o{stall};
    my $server = $o{server} // '';
    my $locations = $o{locations} // '';
    my $workers = $o{workers} // 2;
    $t->write_config(workers => $workers, main => $o{main}, http => <<"EOF");
    $upstream
    kvgate_tenant \$http_x_tenant_id;
    # the pages as they are now at every read: a test reads a change right after
    # making it (t/gateway-pages.t covers the default, a cached page)
    kvgate_page_refresh 0;
    log_format kvgate '\$status t=\$kvgate_tenant b=\$kvgate_bucket p=\$kvgate_prompt_tokens '
                      'c=\$kvgate_cached_tokens g=\$kvgate_completion_tokens s=\$kvgate_cache_status '
                      'ttft=\$kvgate_ttft key=\$kvgate_route_key$elog';
    $http
    server {
        listen 127.0.0.1:%%PORT%%;
        access_log %%PREFIX%%/logs/kvgate.log kvgate;
        client_max_body_size 1m;
        $server
        location /v1/ {
            $pass
        }
        location = /metrics {
            kvgate_metrics;
        }
        location = /status {
            kvgate_status;
        }
        location = /nginx_status {
            stub_status;
        }
        $locations
    }
EOF
    $t->run;
    $self->wait_up;
    return $self;
}

sub t { return $_[0]{t} }
sub engine { return $_[0]{engine} }
sub engine_named { return $_[0]{engines}{ $_[1] } }

# Waits until every worker is connected to the engine (the status page counts them).
sub wait_up {
    my ($self, $timeout) = @_;
    my $want = $self->{o}{workers} // 2;
    $self->{t}->wait_for(sub {
        my $s = $self->status;
        $s && $s->{gateway} && ($s->{gateway}{workers_connected} // 0) >= $want && $s->{engine}{up}
           && !grep { !$_->{up} || ($_->{workers_connected} // 0) < $want } @{ $s->{engines} // [] };
    }, "$want workers connected to the engine", $timeout // 20)
        or croak 'the nginx workers did not connect to the engine';
    return 1;
}

# The first access-log line (logs/kvgate.log) matching $re once it is written (the
# log phase runs after the response); in list context all of them, at least count => n.
sub wait_log {
    my ($self, $re, %o) = @_;
    return $self->{t}->wait_log('logs/kvgate.log', $re, %o);
}

# The status page (decoded) once $cond->($status) holds; the last one read otherwise
# (see Kvgate::Test::wait_for).
sub wait_status {
    my ($self, $cond, $what, $timeout) = @_;
    my $s;
    $self->{t}->wait_for(sub { $s = $self->status; $s && $cond->($s) }, $what, $timeout);
    return $s // {};
}

# The metrics text once $cond->($text) holds; the last one read otherwise.
sub wait_metrics {
    my ($self, $cond, $what, $timeout) = @_;
    my $m;
    $self->{t}->wait_for(sub { $m = $self->metrics; $cond->($m) }, $what, $timeout);
    return $m;
}

# Waits until nginx holds at least $n requests past their headers (stub_status
# "Writing", less the scrape itself). With one worker process that also means each of
# them has been through its content handler: the worker serves the scrape only
# between events, and a request whose body came with its headers (send_raw) is
# submitted, or queued for the engine, within the event that read it.
sub wait_in_nginx {
    my ($self, $n, $timeout) = @_;
    my $writing;
    $self->{t}->wait_for(sub {
        ($writing) = $self->{t}->get('/nginx_status')->{body} =~ /Writing: (\d+)/;
        ($writing // 0) - 1 >= $n;
    }, "$n requests in nginx", $timeout);
    return ($writing // 1) - 1;
}

sub status {
    my ($self) = @_;
    my $r = $self->{t}->get('/status');
    return $r->{status} == 200 ? eval { JSON::PP->new->decode($r->{body}) } : undef;
}

sub metrics {
    my ($self) = @_;
    return $self->{t}->get('/metrics')->{body};
}

# The engine="..." label value of an engine's series: its name, the socket path for the
# default (unnamed) engine.
sub engine_label {
    my ($self, $name) = @_;
    return $name if defined $name;
    return $self->{o}{engines} ? $self->{o}{engines}[0]{name} : $self->{t}->prefix . '/engine.sock';
}

# One engine's series: metric() of 'name{engine="E",labels}' (E: engine_label($engine)).
sub engine_metric {
    my ($self, $text, $name, $labels, $engine) = @_;
    my $e = $self->engine_label($engine);
    return $self->metric($text, $name . '{engine="' . $e . '"' . ($labels ? ",$labels" : '') . '}');
}

# One metric's value from the Prometheus text ("name{labels}" exactly), 0 when absent.
sub metric {
    my ($self, $text, $series) = @_;
    for (split /\n/, $text) {
        return $1 if /^\Q$series\E (\S+)$/;
    }
    return 0;
}

sub post {
    my ($self, $path, $body, %headers) = @_;
    return $self->{t}->post_json($path, $body, %headers);
}

sub completion {
    my ($self, $body, %headers) = @_;
    return $self->post('/v1/completions', { model => $MODEL, %$body }, %headers);
}

sub chat {
    my ($self, $body, %headers) = @_;
    return $self->post('/v1/chat/completions', { model => $MODEL, %$body }, %headers);
}

# A raw HTTP/1.1 request; returns a connected socket after sending it.
sub send_raw {
    my ($self, $path, $body, %headers) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $self->{t}->port(0),
                                  Proto => 'tcp', Timeout => 5) or croak "connect: $!";
    my $json = ref $body ? JSON::PP->new->canonical->encode($body) : $body;
    my $h = join '', map { "$_: $headers{$_}\r\n" } sort keys %headers;
    $s->syswrite("POST $path HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 . "Content-Length: " . length($json) . "\r\nConnection: close\r\n$h\r\n$json");
    return $s;
}

# Reads from a socket until EOF or timeout; returns the bytes.
sub read_all {
    my ($self, $s, $timeout) = @_;
    my $sel = IO::Select->new($s);
    my $buf = '';
    my $deadline = time + ($timeout // 30);
    while (time < $deadline) {
        next unless $sel->can_read(0.2);
        my $n = $s->sysread($buf, 65536, length $buf);
        last unless $n;
    }
    return $buf;
}

# Splits a raw HTTP response with a chunked body into (status, headers, body).
sub parse_http {
    my ($self, $raw) = @_;
    my ($head, $rest) = split /\r\n\r\n/, $raw, 2;
    $rest //= '';
    my ($status) = $head =~ m{^HTTP/1\.[01] (\d+)};
    my %h;
    for (split /\r\n/, $head) {
        $h{lc $1} = $2 if /^([^:]+):\s*(.*)$/;
    }
    my $body = '';
    if (($h{'transfer-encoding'} // '') =~ /chunked/) {
        while ($rest =~ s/\A([0-9a-fA-F]+)\r\n//) {
            my $n = hex $1;
            last if $n == 0;
            $body .= substr($rest, 0, $n, '');
            $rest =~ s/\A\r\n//;
        }
    } else {
        $body = $rest;
    }
    return ($status // 0, \%h, $body);
}

# The events of an SSE body: decoded JSON objects, and 'DONE' for [DONE].
sub sse_events {
    my ($self, $body) = @_;
    my @ev;
    for my $block (split /\n\n/, $body) {
        next unless $block =~ /^data: (.*)$/s;
        my $d = $1;
        push @ev, $d eq '[DONE]' ? 'DONE' : (eval { JSON::PP->new->decode($d) } // { unparsable => $d });
    }
    return @ev;
}

# A whole streamed request: (status, headers, events).
sub stream {
    my ($self, $path, $body, %headers) = @_;
    my $s = $self->send_raw($path, { model => $MODEL, stream => JSON::PP::true, %$body }, %headers);
    my ($status, $h, $b) = $self->parse_http($self->read_all($s));
    close $s;
    return ($status, $h, [ $self->sse_events($b) ]);
}

# Texts per choice index reassembled from stream events.
sub stream_texts {
    my ($self, $events) = @_;
    my @text;
    for my $e (@$events) {
        next unless ref $e;
        for my $c (@{ $e->{choices} // [] }) {
            my $piece = exists $c->{delta} ? ($c->{delta}{content} // '') : ($c->{text} // '');
            $text[$c->{index}] .= $piece;
        }
    }
    return map { $_ // '' } @text;
}

# The nginx master's pid, and its worker processes' pids (sorted): the master's
# children, from /proc.
sub master_pid { return $_[0]{t}{pid} }

sub worker_pids {
    my ($self) = @_;
    my $m = $self->{t}{pid} or return ();
    open my $fh, '<', "/proc/$m/task/$m/children" or return ();
    my $line = <$fh> // '';
    return sort { $a <=> $b } grep { /^\d+$/ } split ' ', $line;
}

# How many established client connections to the main port a process (a worker) holds:
# the sockets of /proc/net/tcp on that port, among the process's descriptors.
sub worker_connections {
    my ($self, $pid) = @_;
    my $port = sprintf '%04X', $self->{t}->port(0);
    my %inode;
    open my $fh, '<', '/proc/net/tcp' or return 0;
    while (my $line = <$fh>) {
        my @f = split ' ', $line;
        # local address 0100007F:PORT, state 01 (established), inode in field 9
        $inode{ $f[9] } = 1 if ($f[1] // '') =~ /:$port$/ && ($f[3] // '') eq '01';
    }
    my $n = 0;
    for my $fd (glob "/proc/$pid/fd/*") {
        my $l = readlink($fd) // next;
        $n++ if $l =~ /^socket:\[(\d+)\]$/ && $inode{$1};
    }
    return $n;
}

# Resident memory of a process in KiB (VmRSS), 0 when it is gone.
sub rss_kb {
    my ($self, $pid) = @_;
    open my $fh, '<', "/proc/$pid/status" or return 0;
    while (my $line = <$fh>) { return $1 if $line =~ /^VmRSS:\s+(\d+)/ }
    return 0;
}

# `nginx -s reload` (HUP to the master), then waits until every worker is a new one (no
# pid of before is left among the master's children) and the new ones have connected to
# the engine. Returns the new workers' pids.
sub reload {
    my ($self, $timeout) = @_;
    my %old = map { $_ => 1 } $self->worker_pids;
    my $want = $self->{o}{workers} // 2;
    kill 'HUP', $self->{t}{pid};
    my @new;
    $self->{t}->wait_for(sub {
        @new = $self->worker_pids;
        @new == $want && !grep { $old{$_} } @new;
    }, 'the workers replaced after a reload', $timeout // 20);
    $self->wait_up($timeout);
    return @new;
}

# Stops nginx (QUIT) and the engine like stop(), asserting nothing: returns (clean, bad
# log lines) where lines matching $allow (say, the master's alert about a worker this
# test killed) are not counted as bad.
sub finish {
    my ($self, $allow) = @_;
    my $clean = $self->{t}->_stop;
    my @bad = grep { !$allow || !/$allow/ } $self->{t}->bad_log_lines;
    $self->{engine}->stop;
    $_ != $self->{engine} and $_->stop for values %{ $self->{engines} // {} };
    return ($clean, @bad);
}

sub stop {
    my ($self) = @_;
    $self->{t}->stop;
    $self->{engine}->stop;
    $_ != $self->{engine} and $_->stop for values %{ $self->{engines} // {} };
}

1;
