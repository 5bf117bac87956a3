package Kvgate::Load;

# A checked mixed load against a Kvgate::Gateway, shared by t/bench/soak and
# t/gateway-faultload.t:
#
#   my @specs = Kvgate::Load::catalog();                 # distinct requests
#   my $refs = Kvgate::Load::references($port, \@specs);  # each run once, alone
#   my $pid = Kvgate::Load::spawn_client($port, \@specs, $refs,
#                                        out => $file, stop => $stopfile, seed => 1);
#   ... my @r = Kvgate::Load::results($file);            # one hash per answer
#
# Every answer is reduced to what must not change from run to run (the status, the text
# of each choice, the error code) and compared with the same request's solo run: with
# temperature 0 or a fixed seed the text must be identical whatever else runs beside it.
# A client writes one line per answer (appended with one write, so a reader never sees
# half a line):  end-time  spec  status  verdict  latency-s  first-byte-s
# verdict: ok (the reference's answer), wrong (a 200 whose text differs, or a stream whose
# text is no prefix of it), cancelled (the client hung up after the first event; what it
# got was a prefix), sse:CODE (a stream that began, then ended with an error event whose
# text so far was a prefix), err:CODE (a status other than the reference's), transport
# (the connection ended before a complete answer), hang (no answer before the deadline).

use strict;
use warnings;

use Errno qw(EINTR EAGAIN);
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use POSIX ();
use Socket qw(IPPROTO_TCP TCP_NODELAY);
use Time::HiRes qw(time);

our $MODEL = 'stories260K';

my $json = JSON::PP->new->canonical;

# ---- the requests ---------------------------------------------------------------------

# Long prompts: well over kvgate_cache_min_tokens (128 tokens), well under the 512-token
# context with max_tokens on top.
my @LONG = (
    join(' ', map { "Lily and Tom went to the park number $_ with their big red ball." } 1 .. 10),
    join(' ', map { "The little cat named Sam saw bird $_ in the garden and ran after it." } 1 .. 10),
);
my @SHORT = ('Once upon a time', 'The dog was happy because', 'Tom had a small boat');
my @TENANTS = (undef, 'acme', 'globex', 'initech');

# All the distinct requests. Each: name, kind (a label for figures), method, path, body
# (a perl structure, or raw bytes), headers, stream, cancel (hang up after the first
# event), bad (an input that must be refused: expect => status, code => error code).
sub catalog {
    my (%o) = @_;
    my @specs;
    my $i = 0;
    for my $ep ('completions', 'chat') {
        for my $stream (0, 1) {
            for my $n (1, 3) {
                my @prompts = ((map { ['short', $_] } @SHORT), (map { ['cached', $_] } @LONG));
                for my $p (@prompts) {
                    my ($len, $text) = @$p;
                    # tenants rotate; the long prompts run under two tenants each, so
                    # that one tenant's cache never serves the other
                    my @ts = $len eq 'cached' ? ($TENANTS[$i % 4], $TENANTS[($i + 1) % 4])
                                              : ($TENANTS[$i % 4]);
                    for my $tenant (@ts) {
                        $i++;
                        my %body = (model => $MODEL, max_tokens => $stream ? 24 : 16,
                                    n => $n, $n > 1 ? (temperature => 0.9, seed => 7 + $i)
                                                    : (temperature => 0));
                        if ($ep eq 'chat') {
                            $body{messages} = [ { role => 'user', content => $text } ];
                        } else {
                            $body{prompt} = $text;
                        }
                        $body{stream} = JSON::PP::true if $stream;
                        push @specs, { name => "r$i", kind => sprintf('%-11s %-6s n=%d %s', $ep,
                                           $stream ? 'stream' : 'plain', $n, $len),
                                       method => 'POST', path => "/v1/$ep" eq '/v1/chat'
                                           ? '/v1/chat/completions' : "/v1/$ep",
                                       body => \%body, stream => $stream,
                                       headers => { defined $tenant ? ('X-Tenant-Id' => $tenant) : () } };
                    }
                }
            }
        }
    }
    # streams the client leaves after the first event
    for my $k (0 .. 3) {
        $i++;
        my $ep = $k % 2 ? 'chat/completions' : 'completions';
        my %body = (model => $MODEL, max_tokens => 150, n => 2, temperature => 0.8, seed => $i,
                    stream => JSON::PP::true);
        if ($k % 2) { $body{messages} = [ { role => 'user', content => $LONG[$k % 2] } ] }
        else        { $body{prompt} = $k < 2 ? $SHORT[0] : $LONG[0] }
        push @specs, { name => "c$i", kind => 'cancelled mid-stream', method => 'POST',
                       path => "/v1/$ep", body => \%body, stream => 1, cancel => 1,
                       headers => { 'X-Tenant-Id' => $TENANTS[1 + $k % 3] } };
    }
    # bad inputs, each with its exact answer
    my @bad = (
        [ 'POST', '/v1/completions', '{"model": "stories260K", "prompt": ', 400, undef ],
        [ 'POST', '/v1/completions', { model => $MODEL, prompt => 'x', max_tokens => 100000 }, 400, undef ],
        [ 'POST', '/v1/completions', { model => 'no-such-model', prompt => 'x' }, 404, 'model_not_found' ],
        [ 'GET', '/v1/completions', undef, 405, undef ],
        [ 'POST', '/v1/chat/completions', { model => $MODEL, messages => [], max_tokens => 4 }, 400, undef ],
        [ 'POST', '/v1/completions', { model => $MODEL, prompt => 'x', n => 99 }, 400, undef ],
        [ 'POST', '/v1/completions', { model => $MODEL, prompt => 'hi ' x 700, max_tokens => 4 }, 400,
          'context_length_exceeded' ],
    );
    for my $b (@bad) {
        $i++;
        push @specs, { name => "b$i", kind => 'bad input', method => $b->[0], path => $b->[1],
                       body => $b->[2], headers => {}, bad => 1, expect => $b->[3], code => $b->[4] };
    }
    return @specs;
}

# ---- one keep-alive HTTP/1.1 connection ---------------------------------------------------

sub conn {
    my ($port) = @_;
    return bless { port => $port, s => undef }, 'Kvgate::Load::Conn';
}

package Kvgate::Load::Conn;

use Errno qw(EINTR);
use IO::Select;
use Socket qw(IPPROTO_TCP TCP_NODELAY);
use Time::HiRes qw(time);

sub close_it {
    my ($self) = @_;
    close $self->{s} if $self->{s};
    $self->{s} = undef;
}

sub _open {
    my ($self) = @_;
    return $self->{s} if $self->{s};
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $self->{port}, Proto => 'tcp',
                                  Timeout => 5) or return undef;
    setsockopt($s, IPPROTO_TCP, TCP_NODELAY, 1);
    $self->{s} = $s;
    $self->{buf} = '';
    $self->{used} = 0;
    return $s;
}

# Reads more into buf; 0 at EOF or error, -1 at the deadline.
sub _more {
    my ($self, $deadline) = @_;
    my $sel = IO::Select->new($self->{s});
    while (1) {
        my $left = $deadline - time;
        return -1 if $left <= 0;
        next unless $sel->can_read($left < 0.5 ? $left : 0.5);
        my $n = sysread($self->{s}, $self->{buf}, 65536, length $self->{buf});
        next if !defined $n && $! == EINTR;
        return $n ? 1 : 0;
    }
}

# One request. Returns { status, headers, body, first (s to the first body byte),
# total (s), error => 'transport'|'hang' when no complete answer came, cancelled => 1 }.
# cancel => 1: hang up once the first SSE event is in.
sub request {
    my ($self, $method, $path, $body, $headers, %o) = @_;
    my $t0 = time;
    my $deadline = $t0 + ($o{timeout} // 60);
    my $retried = 0;
  AGAIN:
    my $s = $self->_open or return { error => 'transport', total => time - $t0, why => "connect: $!" };
    my $h = join '', map { "$_: $headers->{$_}\r\n" } sort keys %{ $headers // {} };
    my $req = "$method $path HTTP/1.1\r\nHost: localhost\r\n$h";
    $req .= "Content-Type: application/json\r\nContent-Length: " . length($body) . "\r\n" if defined $body;
    $req .= "\r\n" . ($body // '');
    local $SIG{PIPE} = 'IGNORE';
    my $w = syswrite($s, $req);
    my $r = { total => 0 };
    # headers
    while ($self->{buf} !~ /\r\n\r\n/) {
        my $m = defined $w ? $self->_more($deadline) : 0;
        if ($m <= 0) {
            $self->close_it;
            # a keep-alive connection the server closed while idle (a reload, a worker
            # that exited): the request never reached it, send it again once
            if ($m == 0 && !$retried && $self->{used} && length($self->{buf}) == 0) {
                $retried = 1;
                goto AGAIN;
            }
            return { error => $m < 0 ? 'hang' : 'transport', total => time - $t0 };
        }
    }
    $self->{buf} =~ s/\A(.*?)\r\n\r\n//s;
    my $head = $1;
    my ($status) = $head =~ m{^HTTP/1\.[01] (\d+)};
    my %hd;
    for (split /\r\n/, $head) { $hd{lc $1} = $2 if /^([^:]+):\s*(.*)$/ }
    $r->{status} = $status // 0;
    $r->{headers} = \%hd;
    my $bodyout = '';
    my $first;
    if (($hd{'transfer-encoding'} // '') =~ /chunked/) {
        while (1) {
            if ($self->{buf} =~ s/\A([0-9a-fA-F]+)[^\r\n]*\r\n//) {
                my $n = hex $1;
                if ($n == 0) {
                    while ($self->{buf} !~ /\A\r\n/ && $self->{buf} !~ /\r\n\r\n/) {
                        my $m = $self->_more($deadline);
                        last if $m <= 0;
                    }
                    $self->{buf} = '';
                    last;
                }
                while (length($self->{buf}) < $n + 2) {
                    my $m = $self->_more($deadline);
                    if ($m <= 0) {
                        $self->close_it;
                        $bodyout .= $self->{buf} // '';
                        return { %$r, body => $bodyout, error => $m < 0 ? 'hang' : 'transport',
                                 total => time - $t0, first => $first };
                    }
                }
                $bodyout .= substr($self->{buf}, 0, $n, '');
                substr($self->{buf}, 0, 2, '');
                $first //= time - $t0;
                if ($o{cancel} && $r->{status} == 200 && $bodyout =~ /data: \{.*?\n\n/s) {
                    $self->close_it;
                    return { %$r, body => $bodyout, cancelled => 1, total => time - $t0, first => $first };
                }
                next;
            }
            my $m = $self->_more($deadline);
            if ($m <= 0) {
                $self->close_it;
                return { %$r, body => $bodyout, error => $m < 0 ? 'hang' : 'transport', total => time - $t0,
                         first => $first };
            }
        }
    } else {
        my $len = $hd{'content-length'} // 0;
        while (length($self->{buf}) < $len) {
            my $m = $self->_more($deadline);
            if ($m <= 0) {
                $self->close_it;
                return { %$r, body => $self->{buf}, error => $m < 0 ? 'hang' : 'transport', total => time - $t0 };
            }
        }
        $bodyout = substr($self->{buf}, 0, $len, '');
        $first = time - $t0;
    }
    $self->{used} = 1;
    $self->close_it if ($hd{connection} // '') =~ /close/i || $o{cancel};
    return { %$r, body => $bodyout, total => time - $t0, first => $first };
}

package Kvgate::Load;

# Sends one spec on a connection; the raw response.
sub send_spec {
    my ($c, $spec, %o) = @_;
    my $body = !defined $spec->{body} ? undef : ref $spec->{body} ? $json->encode($spec->{body}) : $spec->{body};
    return $c->request($spec->{method}, $spec->{path}, $body, $spec->{headers},
                       cancel => $spec->{cancel} && !$o{full}, %o);
}

sub _events {
    my ($body) = @_;
    my @ev;
    for my $block (split /\n\n/, $body // '') {
        next unless $block =~ /^data: (.*)$/s;
        my $d = $1;
        push @ev, $d eq '[DONE]' ? 'DONE' : (eval { JSON::PP->new->decode($d) } // { unparsable => $d });
    }
    return @ev;
}

# What must be the same from run to run: { status, texts => [...], finish => [...],
# done, error (code) }.
sub answer {
    my ($spec, $r) = @_;
    my $a = { status => $r->{status} // 0, texts => [], finish => [] };
    if ($a->{status} != 200) {
        my $j = eval { JSON::PP->new->decode($r->{body}) };
        $a->{error} = ref $j eq 'HASH' && ref $j->{error} eq 'HASH' ? ($j->{error}{code} // $j->{error}{type} // '?')
                                                                    : 'no-json';
        return $a;
    }
    if ($spec->{stream}) {
        for my $e (_events($r->{body})) {
            if (!ref $e) { $a->{done} = 1; next }
            if ($e->{error}) { $a->{error} = $e->{error}{code} // '?'; next }
            for my $ch (@{ $e->{choices} // [] }) {
                my $piece = exists $ch->{delta} ? ($ch->{delta}{content} // '') : ($ch->{text} // '');
                $a->{texts}[$ch->{index}] .= $piece;
                $a->{finish}[$ch->{index}] = $ch->{finish_reason} if defined $ch->{finish_reason};
            }
        }
    } else {
        my $j = eval { JSON::PP->new->decode($r->{body}) } // {};
        for my $ch (@{ $j->{choices} // [] }) {
            $a->{texts}[$ch->{index}] = exists $ch->{message} ? ($ch->{message}{content} // '') : ($ch->{text} // '');
            $a->{finish}[$ch->{index}] = $ch->{finish_reason};
        }
        $a->{done} = 1 if @{ $j->{choices} // [] };
    }
    $_ //= '' for @{ $a->{texts} };
    $_ //= '' for @{ $a->{finish} };
    return $a;
}

sub _prefixes {
    my ($got, $want) = @_;
    return 0 if @{ $got->{texts} } > @{ $want->{texts} };
    for my $i (0 .. $#{ $got->{texts} }) {
        my $g = $got->{texts}[$i] // '';
        return 0 unless substr($want->{texts}[$i] // '', 0, length $g) eq $g;
    }
    return 1;
}

# The verdict of one response against the spec's reference answer.
sub verdict {
    my ($spec, $ref, $r) = @_;
    return $r->{error} if $r->{error} && !defined $r->{status};
    my $a = answer($spec, $r);
    if ($r->{cancelled}) {
        return _prefixes($a, $ref) ? 'cancelled' : 'wrong';
    }
    if ($a->{status} != 200) {
        return 'ok' if $a->{status} == $ref->{status} && ($a->{error} // '') eq ($ref->{error} // '');
        return "err:$a->{error}";
    }
    return 'wrong' if $ref->{status} != 200;
    if ($r->{error}) {   # cut off after the headers
        return _prefixes($a, $ref) ? $r->{error} : 'wrong';
    }
    if ($spec->{stream} && $a->{error}) {
        return _prefixes($a, $ref) ? "sse:$a->{error}" : 'wrong';
    }
    return 'transport' unless $a->{done};
    my $same = join("\0", @{ $a->{texts} }) eq join("\0", @{ $ref->{texts} })
        && join("\0", @{ $a->{finish} }) eq join("\0", @{ $ref->{finish} })
        && @{ $a->{texts} } == @{ $ref->{texts} };
    return $same ? 'ok' : 'wrong';
}

# Runs every spec once, alone, on a fresh connection (cancelled ones to their end); the
# reference answers by name. Dies when a bad input is not refused as the catalog says,
# or a good one fails.
sub references {
    my ($port, $specs) = @_;
    my %ref;
    my $c = conn($port);
    for my $spec (@$specs) {
        my $r = send_spec($c, $spec, full => 1);
        die "$spec->{name}: no answer ($r->{error})\n" if $r->{error};
        my $a = answer($spec, $r);
        if ($spec->{bad}) {
            die "$spec->{name} ($spec->{path}): status $a->{status}, not $spec->{expect}: $r->{body}\n"
                unless $a->{status} == $spec->{expect};
            die "$spec->{name}: error code $a->{error}, not $spec->{code}\n"
                if defined $spec->{code} && $a->{error} ne $spec->{code};
        } else {
            die "$spec->{name}: status $a->{status}: $r->{body}\n" unless $a->{status} == 200 && $a->{done};
        }
        $ref{ $spec->{name} } = $a;
    }
    return \%ref;
}

# A forked client: until the stop file exists or `until` (epoch s) passes, sends specs
# in a random order (seeded) on one keep-alive connection and appends a line per answer
# to `out`. `only` => [names] narrows the choice; `detail` => file gets what the first
# few unexpected answers held. Returns the pid.
sub spawn_client {
    my ($port, $specs, $refs, %o) = @_;
    my $parent = $$;
    my $pid = fork // die "fork: $!";
    return $pid if $pid;
    srand($o{seed} // $$);
    my @pick = $o{only} ? grep { my $n = $_->{name}; grep { $_ eq $n } @{ $o{only} } } @$specs : @$specs;
    open my $fh, '>>', $o{out} or POSIX::_exit(2);
    my $c = conn($port);
    my ($done, $bad) = (0, 0);
    # (a client whose test or soak died stops too: never an orphan spinning on a dead port)
    while (getppid() == $parent && !($o{stop} && -e $o{stop}) && (!$o{until} || time < $o{until})
           && (!$o{count} || $done < $o{count})) {
        my $spec = $pick[ int rand @pick ];
        my $r = send_spec($c, $spec, timeout => $o{timeout} // 60);
        my $v = verdict($spec, $refs->{ $spec->{name} }, $r);
        syswrite $fh, sprintf("%.6f %s %d %s %.6f %.6f\n", time, $spec->{name}, $r->{status} // 0, $v,
                              $r->{total} // 0, $r->{first} // 0);
        # what an unexpected answer said, for the report (the first few)
        if ($o{detail} && $v ne 'ok' && $v ne 'cancelled' && $bad++ < 5 && open my $d, '>>', $o{detail}) {
            print $d "== $spec->{name} ($spec->{kind}) $v, status ", $r->{status} // 0, "\n",
                     "want: ", $json->encode($refs->{ $spec->{name} }), "\n",
                     "got:  ", $json->encode(answer($spec, $r)), "\n", substr($r->{body} // '', 0, 2000), "\n";
            close $d;
        }
        $done++;
        # a connection that failed is not used again
        $c->close_it if $v ne 'ok' && $v ne 'cancelled';
    }
    close $fh;
    POSIX::_exit(0);
}

# The answers in a client file: [{ t, name, status, verdict, latency, first }].
sub results {
    my (@files) = @_;
    my @r;
    for my $f (@files) {
        open my $fh, '<', $f or next;
        while (my $l = <$fh>) {
            next unless $l =~ /\n\z/;
            my @x = split ' ', $l;
            push @r, { t => $x[0], name => $x[1], status => $x[2], verdict => $x[3], latency => $x[4],
                       first => $x[5] };
        }
    }
    return @r;
}

1;
