package Kvgate::Test;

# Harness for the tests that run kvgate's module inside a real nginx (in the spirit of
# nginx's own test suite; Test::Nginx is not packaged in Debian).
#
#   use FindBin; use lib "$FindBin::Bin/lib";
#   use Test::More; use Kvgate::Test;
#
#   my $t = Kvgate::Test->new;            # plan skip_all when the module is not built
#   $t->write_config(http => <<'EOF');    # the inside of http {}, see conf_text()
#       kvgate_engine unix:%%PREFIX%%/engine.sock;
#       server { listen 127.0.0.1:%%PORT%%; location / { kvgate_pass; } }
#   EOF
#   $t->run;                               # nginx -t, start, wait for the ports
#   my $r = $t->get('/v1/models');         # { status, headers, body, json }
#   my $line = $t->wait_log('logs/access.log', qr/ 200 /);   # written after the response
#   ok($t->wait_for(sub { ... }, 'what the server must get to'));
#   $t->stop;                              # QUIT, wait, error.log must be clean (one test)
#   done_testing;
#
# One nginx per test file, in a temporary prefix. Environment:
#   BUILD=dir           build directory holding the module (default: build), as in the Makefile
#   KVGATE_ASAN=1       use $BUILD/asan/ngx_http_kvgate_module.so and preload libasan into nginx
#   KVGATE_MODULE=path  use this .so instead
#   KVGATE_TEST_KEEP=1  keep the temporary prefix (it is also kept when a test failed)
#   KVGATE_NGINX=path   nginx binary (default: /usr/sbin/nginx)
#   KVGATE_WAIT_S=n     deadline of wait_for/wait_log (default 5 s, 10 s under ASan)
#
# What a server writes after the response (the access log and the counters of nginx's
# log phase, which runs after the last byte is sent; the engine's statistics; a file) is
# never read once or after a fixed sleep: wait_for polls it with a deadline.

use strict;
use warnings;

use Carp qw(croak);
use Cwd qw(abs_path);
use Errno qw(EINTR);
use File::Basename qw(dirname);
use File::Path qw(remove_tree);
use File::Spec;
use File::Temp qw(tempdir);
use HTTP::Tiny;
use IO::Select;
use IO::Socket::INET;
use IPC::Open3 qw(open3);
use JSON::PP;
use POSIX qw(WNOHANG);
use Symbol qw(gensym);
use Test::More;
use Time::HiRes qw(sleep time);

# error.log lines that fail a test file: nginx's own alarms, crashed workers and
# sanitizer reports (workers' stderr is error.log).
our $BAD_LOG_LINE = qr/\[alert\]|\[emerg\]|exited on signal|AddressSanitizer|LeakSanitizer|runtime error:/;

my $parent_pid = $$;
my @instances;

sub repo_root {
    return abs_path(File::Spec->catdir(dirname(abs_path(__FILE__)), '..', '..', '..'));
}

sub asan { return ($ENV{KVGATE_ASAN} // '') eq '1' }

sub nginx_binary { return $ENV{KVGATE_NGINX} || '/usr/sbin/nginx' }

sub module_path {
    return $ENV{KVGATE_MODULE} if $ENV{KVGATE_MODULE};
    my $build = $ENV{BUILD} || 'build';
    $build = File::Spec->catdir(repo_root(), $build) unless File::Spec->file_name_is_absolute($build);
    return File::Spec->catfile($build, asan() ? ('asan') : (), 'ngx_http_kvgate_module.so');
}

# The libasan the ASan module was linked against must come first in nginx's process.
sub libasan_path {
    my $p = `gcc -print-file-name=libasan.so 2>/dev/null` // '';
    chomp $p;
    return -e $p ? abs_path($p) : undef;
}

sub new {
    my ($class, %opt) = @_;

    my $module = module_path();
    unless (-f $module) {
        my $how = asan() ? 'KVG_MODULE_ASAN=1 scripts/build-module.sh' : 'make module';
        plan skip_all => "nginx module $module not built (run '$how'; make test always builds it)";
    }

    my $nginx = nginx_binary();
    croak "$nginx not found or not executable" unless -x $nginx;

    my $base = $ENV{TMPDIR} && -d $ENV{TMPDIR} ? $ENV{TMPDIR} : '/tmp';
    my $prefix = tempdir('kvgate-nginx-XXXXXX', DIR => $base);
    # Started as root, nginx's workers run as nobody and must traverse the prefix to
    # reach their temp dirs (and, later, the engine's socket); tempdir() makes it 0700.
    chmod 0755, $prefix or croak "chmod $prefix: $!";
    mkdir "$prefix/$_" or croak "mkdir $prefix/$_: $!" for qw(conf logs);

    my $self = bless {
        prefix   => $prefix,
        module   => $module,
        nginx    => $nginx,
        ports    => {},
        pid      => undef,
        children => [],
        asan     => asan(),
        opt      => \%opt,
    }, $class;
    push @instances, $self;
    return $self;
}

sub prefix { return $_[0]{prefix} }
sub module { return $_[0]{module} }
sub error_log { return "$_[0]{prefix}/logs/error.log" }

# A port that was free a moment ago (bind to 0, close). Stable per index for this object.
# Never one this process handed out before: the kernel may well give a port just closed
# again, and one config listing it twice has nginx serve both servers on one socket
# (it only warns: "conflicting server name"), so the test talks to the wrong server.
my %issued;
sub port {
    my ($self, $i) = @_;
    $i //= 0;
    return $self->{ports}{$i} //= do {
        my $p;
        for my $try (1 .. 1000) {
            my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 1,
                                          ReuseAddr => 1, Proto => 'tcp')
                or croak "cannot find a free port: $!";
            $p = $s->sockport;
            close $s;
            last unless $issued{$p};
        }
        croak "cannot find a port not handed out before" if $issued{$p}++;
        $p;
    };
}

# Replaces %%PREFIX%%, %%PORT%% (= %%PORT_0%%) and %%PORT_n%%.
sub expand {
    my ($self, $text) = @_;
    $text =~ s/%%PREFIX%%/$self->{prefix}/g;
    $text =~ s/%%PORT%%/$self->port(0)/ge;
    $text =~ s/%%PORT_(\d+)%%/$self->port($1)/ge;
    return $text;
}

# A whole nginx.conf around the given pieces:
#   http  => inside http {}            main => extra main-context lines
#   workers => worker_processes (default 1)
#   events => inside events {}         error_log_level => (default notice)
#   load_module => 0 to leave the module out
sub conf_text {
    my ($self, %c) = @_;
    my $p = $self->{prefix};
    my $level = $c{error_log_level} // 'notice';
    my $workers = $c{workers} // 1;
    my $load = ($c{load_module} // 1) ? "load_module $self->{module};\n" : '';
    my $text = <<"EOF";
# generated by t/lib/Kvgate/Test.pm
${load}
daemon off;
master_process on;
worker_processes $workers;
pid $p/logs/nginx.pid;
error_log $p/logs/error.log $level;
@{[ $c{main} // '' ]}

events {
    worker_connections 256;
@{[ $c{events} // '' ]}
}

http {
    access_log $p/logs/access.log;
    client_body_temp_path $p/client_body_temp;
    proxy_temp_path $p/proxy_temp;
    fastcgi_temp_path $p/fastcgi_temp;
    uwsgi_temp_path $p/uwsgi_temp;
    scgi_temp_path $p/scgi_temp;

@{[ $c{http} // '' ]}
}
EOF
    return $self->expand($text);
}

sub _write {
    my ($path, $text) = @_;
    open my $fh, '>', $path or croak "write $path: $!";
    print $fh $text;
    close $fh or croak "write $path: $!";
}

sub write_config {
    my ($self, %c) = @_;
    # kept: run() renders it again with fresh ports if one was taken meanwhile
    $self->{conf} = \%c;
    _write("$self->{prefix}/conf/nginx.conf", $self->conf_text(%c));
    return $self;
}

sub write_file {
    my ($self, $name, $text) = @_;
    _write("$self->{prefix}/$name", $self->expand($text));
    return "$self->{prefix}/$name";
}

sub read_file {
    my ($self, $name) = @_;
    my $path = $name =~ m{^/} ? $name : "$self->{prefix}/$name";
    open my $fh, '<', $path or return '';
    local $/;
    return scalar <$fh>;
}

# Environment for an nginx process: preload libasan for the ASan module, and never pass
# NGINX on (nginx takes it for a list of inherited listening sockets).
sub _nginx_env {
    my ($self) = @_;
    my %env = %ENV;
    delete $env{NGINX};
    # KVGATE_NGINX_PRELOAD: a test's LD_PRELOAD shim (t/shim/), for nginx only
    my @preload = grep { length } ($ENV{KVGATE_NGINX_PRELOAD} // '');
    if ($self->{asan}) {
        my $lib = libasan_path() or croak 'KVGATE_ASAN=1 but gcc -print-file-name=libasan.so finds nothing';
        unshift @preload, $lib;
        # nginx does not free its cycle pools at exit; leak reports would be noise. The
        # caller's options (make test sets detect_leaks=1 for the unit tests) come first,
        # so ours win: ASan takes the last value of a repeated option.
        $env{ASAN_OPTIONS} = join ':', grep { length } ($ENV{ASAN_OPTIONS} // ''),
            'detect_leaks=0:abort_on_error=1';
        $env{UBSAN_OPTIONS} //= 'print_stacktrace=1:halt_on_error=1';
    }
    $env{LD_PRELOAD} = join ':', @preload if @preload;
    return \%env;
}

# Runs `nginx -t` on a config: either a whole text (conf => ...) or the pieces of
# conf_text (http => ..., main => ...). Returns (exit status, combined output).
my $conf_seq = 0;
sub nginx_t {
    my ($self, %c) = @_;
    my $text = exists $c{conf} ? $self->expand($c{conf}) : $self->conf_text(%c);
    my $n = ++$conf_seq;
    my $conf = "conf/check-$n.conf";
    _write("$self->{prefix}/$conf", $text);
    return $self->_run_nginx('-t', '-c', $conf, '-e', "$self->{prefix}/logs/check-$n.log");
}

sub _run_nginx {
    my ($self, @args) = @_;
    my $env = $self->_nginx_env;
    local %ENV = %$env;
    my $out = gensym;
    my $pid = open3(my $in, $out, undef, $self->{nginx}, '-p', "$self->{prefix}/", @args);
    close $in;
    my $text = do { local $/; <$out> } // '';
    waitpid $pid, 0;
    # A signal (an ASan abort, a crash) must not read as exit status 0.
    my $st = $?;
    return (($st & 127) ? 128 + ($st & 127) : $st >> 8, $text);
}

# nginx -t, then start nginx (daemon off, so the master is our child) and wait until it
# has bound every port (it writes its pid file after that) and each accepts
# connections. Dies with nginx's output on failure (not BAIL_OUT: the other test files
# still run).
#
# port() hands out ports that were free a moment ago: another process (a concurrent
# test run, some client's ephemeral port) may have taken one since. nginx then fails
# to bind; the config written by write_config is rendered again with fresh ports and
# nginx started again, the failed attempt's log lines (its [emerg]) set aside in
# logs/*.bind-N so that they do not fail the file.
sub run {
    my ($self) = @_;
    croak 'nginx already running' if $self->{pid};

    for my $attempt (1 .. 4) {
        my %size = map { $_ => (-s "$self->{prefix}/logs/$_" // 0) } qw(error.log stderr.log);
        my $err = $self->_start;
        return $self unless defined $err;
        croak $err unless $err =~ /Address already in use/ && $self->{conf} && $attempt < 4;
        diag("a port was taken before nginx bound it; starting again on other ports");
        for my $log (sort keys %size) {
            my $path = "$self->{prefix}/logs/$log";
            my $text = $self->read_file($path);
            _write("$path.bind-$attempt", substr($text, $size{$log})) if length $text > $size{$log};
            truncate $path, $size{$log} if -e $path;
        }
        $self->{ports} = {};
        $self->write_config(%{ $self->{conf} });
    }
}

# One start; undef when nginx is up, else what went wrong.
sub _start {
    my ($self) = @_;
    my ($rc, $out) = $self->_run_nginx('-t', '-c', 'conf/nginx.conf');
    if ($rc != 0) {
        croak "nginx -t failed for $self->{prefix}/conf/nginx.conf:\n$out";
    }

    my $env = $self->_nginx_env;
    my $pid = fork // croak "fork: $!";
    if ($pid == 0) {
        %ENV = %$env;
        open STDIN, '<', '/dev/null';
        open STDOUT, '>>', "$self->{prefix}/logs/stderr.log";
        open STDERR, '>&', \*STDOUT;
        { no warnings 'exec';
          exec $self->{nginx}, '-p', "$self->{prefix}/", '-c', 'conf/nginx.conf',
              '-e', "$self->{prefix}/logs/error.log"; }
        print STDERR "exec $self->{nginx}: $!\n";
        POSIX::_exit(127);
    }
    $self->{pid} = $pid;

    # A port that accepts is not proof: until our nginx has bound it, it may be
    # someone else's. The pid file naming our master is written after the binds.
    my $deadline = time + ($self->{asan} ? 20 : 10);
    my @ports = sort { $a <=> $b } values %{ $self->{ports} };
    while (1) {
        my $mine = ($self->read_file('logs/nginx.pid') =~ /^(\d+)/ ? $1 : 0) == $pid;
        last if $mine && !grep { !IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $_,
                                                         Proto => 'tcp') } @ports;
        if (waitpid($pid, WNOHANG) == $pid) {
            $self->{pid} = undef;
            return "nginx exited with status $? during start-up:\n"
                . $self->read_file('logs/error.log') . $self->read_file('logs/stderr.log');
        }
        if (time > $deadline) {
            croak("nginx did not start listening on 127.0.0.1:@ports:\n"
                . $self->read_file('logs/error.log'));
        }
        sleep 0.02;
    }
    return undef;
}

sub running { return defined $_[0]{pid} }

# Graceful stop: QUIT, wait (escalating to TERM, then KILL), then one test asserting
# that the master exited 0 on QUIT and the logs hold nothing in $BAD_LOG_LINE.
sub stop {
    my ($self, $name) = @_;
    my $clean = $self->_stop;
    return $self->check_logs($name // 'graceful quit, no alerts/crashes/sanitizer reports in error.log',
                             $clean);
}

sub _stop {
    my ($self) = @_;
    my $pid = $self->{pid} or return 1;
    my $clean = 1;
    kill 'QUIT', $pid;
    my $deadline = time + ($self->{asan} ? 20 : 10);
    my @escalate = ('TERM', 'KILL');
    while (waitpid($pid, WNOHANG) != $pid) {
        if (time > $deadline) {
            my $sig = shift @escalate or last;
            diag("nginx $pid ignored QUIT; sending $sig");
            $clean = 0;
            kill $sig, $pid;
            $deadline = time + 5;
        }
        sleep 0.02;
    }
    $clean = 0 if $? != 0;
    diag("nginx master exited with status $?") if $? != 0;
    $self->{pid} = undef;
    return $clean;
}

sub bad_log_lines {
    my ($self) = @_;
    my @bad;
    for my $f ('logs/error.log', 'logs/stderr.log') {
        push @bad, grep { /$BAD_LOG_LINE/ } split /\n/, $self->read_file($f);
    }
    return @bad;
}

sub check_logs {
    my ($self, $name, $also) = @_;
    my @bad = $self->bad_log_lines;
    my $ok = ok(!@bad && ($also // 1), $name // 'error.log clean');
    diag(join "\n", "error.log of $self->{prefix}:", @bad) if @bad;
    return $ok;
}

# --- waiting for what a server writes after the response --------------------------------

# The deadline of a wait: generous, since it only runs out when the test fails anyway.
sub wait_timeout { return $ENV{KVGATE_WAIT_S} || (asan() ? 10 : 5) }

# $t->wait_for(sub { ... }, 'what', timeout): calls the condition every 20 ms until it
# returns a true value, which wait_for returns. At the deadline (wait_timeout() by
# default) a diag says what never happened and the condition's last (false) value is
# returned, so that the assertion that follows fails with its own message. Also
# callable as Kvgate::Test->wait_for(...).
sub wait_for {
    my ($self, $cond, $what, $timeout) = @_;
    my $limit = $timeout // wait_timeout();
    my $deadline = time + $limit;
    while (1) {
        my $v = $cond->();
        return $v if $v;
        if (time > $deadline) {
            diag(sprintf('waited %.1f s in vain for %s', $limit, $what // 'a condition'));
            return $v;
        }
        sleep 0.02;
    }
}

# The complete lines (nginx writes each with one write()) of a log file (a name under
# the prefix, or a path) that match $re, once there are at least count => n (default
# 1); in scalar context the first. An empty list when they never come (see wait_for).
#   my $line = $t->wait_log('logs/access.log', qr/ 404 /);
sub wait_log {
    my ($self, $name, $re, %o) = @_;
    my $n = $o{count} // 1;
    my @lines;
    $self->wait_for(sub {
        (my $text = $self->read_file($name)) =~ s/[^\n]*\z//;   # a line still being written
        @lines = grep { /$re/ } split /\n/, $text;
        @lines >= $n;
    }, $o{what} // "$n line(s) matching $re in $name", $o{timeout});
    return wantarray ? (@lines >= $n ? @lines : ()) : (@lines >= $n ? $lines[0] : undef);
}

# Runs code in a forked process (a fake engine, a slow client...), killed and reaped
# when the test file ends. Returns the pid.
sub spawn {
    my ($self, $code) = @_;
    my $pid = fork // croak "fork: $!";
    if ($pid == 0) {
        eval { $code->(); 1 } or warn $@;
        POSIX::_exit(0);
    }
    push @{ $self->{children} }, $pid;
    return $pid;
}

# --- HTTP ---------------------------------------------------------------------------

sub url {
    my ($self, $path, $port) = @_;
    return "http://127.0.0.1:" . ($port // $self->port(0)) . $path;
}

sub _response {
    my ($res) = @_;
    my $r = { status => $res->{status}, headers => $res->{headers}, body => $res->{content} // '' };
    if (($r->{headers}{'content-type'} // '') =~ m{^application/json}) {
        $r->{json} = eval { JSON::PP->new->decode($r->{body}) };
    }
    return $r;
}

sub http_client {
    return HTTP::Tiny->new(timeout => 10, keep_alive => 0, max_redirect => 0);
}

# request('GET', '/path', headers => {...}, body => '...', port => n)
sub request {
    my ($self, $method, $path, %o) = @_;
    my $res = http_client()->request($method, $self->url($path, $o{port}), {
        headers => $o{headers} // {},
        defined $o{body} ? (content => $o{body}) : (),
    });
    return _response($res);
}

sub get {
    my ($self, $path, %headers) = @_;
    return $self->request('GET', $path, headers => \%headers);
}

# post_json('/v1/chat/completions', {model => ...} or a raw string, %headers)
sub post_json {
    my ($self, $path, $data, %headers) = @_;
    my $body = ref $data ? JSON::PP->new->canonical->encode($data) : $data;
    return $self->request('POST', $path,
        headers => { 'Content-Type' => 'application/json', %headers }, body => $body);
}

# Sends raw bytes and returns everything read until the server closes (or timeout s).
sub raw {
    my ($self, $bytes, %o) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $o{port} // $self->port(0),
                                  Proto => 'tcp', Timeout => 5)
        or croak "connect: $!";
    $s->syswrite($bytes) // croak "write: $!";
    my $sel = IO::Select->new($s);
    my $buf = '';
    my $deadline = time + ($o{timeout} // 10);
    while (time < $deadline) {
        next unless $sel->can_read($deadline - time);
        my $n = $s->sysread($buf, 65536, length $buf);
        next if !defined $n && $! == EINTR;
        last unless $n;
    }
    close $s;
    return $buf;
}

# Splits raw HTTP/1.x responses (Content-Length framed) into a list of
# { status, headers (lowercase keys), body }.
sub parse_responses {
    my ($class_or_self, $buf) = @_;
    my @out;
    while ($buf =~ s/\AHTTP\/1\.[01] (\d{3})[^\r\n]*\r\n((?:[^\r\n]+\r\n)*)\r\n//) {
        my ($status, $head) = ($1, $2);
        my %h;
        for (split /\r\n/, $head) {
            my ($k, $v) = /^([^:]+):\s*(.*)$/ or next;
            $h{lc $k} = $v;
        }
        my $len = $h{'content-length'} // 0;
        my $body = substr($buf, 0, $len, '');
        push @out, { status => $status, headers => \%h, body => $body };
    }
    return @out;
}

# --- end of file ----------------------------------------------------------------------

sub _cleanup {
    my ($self, $exit) = @_;
    my $failed = 0;
    if ($self->{pid}) {
        $failed = 1 unless $self->_stop;
        # A file that never called stop() still must not hide a crash or an alert.
        my @bad = $self->bad_log_lines;
        if (@bad) {
            diag(join "\n", "error.log of $self->{prefix}:", @bad);
            $failed = 1;
        }
    }
    for my $pid (@{ $self->{children} }) {
        kill 'KILL', $pid;
        waitpid $pid, 0;
    }
    @{ $self->{children} } = ();
    my $passing = Test::More->builder->is_passing;
    if (($ENV{KVGATE_TEST_KEEP} // '') eq '1' || !$passing || $failed || $exit) {
        diag("kept nginx prefix $self->{prefix}");
    } else {
        remove_tree($self->{prefix});
    }
    return $failed;
}

END {
    # Forked helpers (spawn) must not tear down the parent's nginx.
    if ($$ == $parent_pid) {
        my $failed = 0;
        my $exit = $?;
        {
            local $?;
            $failed += $_->_cleanup($exit) for @instances;
            @instances = ();
        }
        $? ||= 1 if $failed;
    }
}

1;
