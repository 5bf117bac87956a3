package Kvgate::Engine;

# A kvgate-engine process for the perl tests:
#
#   use Kvgate::Engine;
#   my $e = Kvgate::Engine->start(socket => "$dir/engine.sock");   # stories260K by default
#   ... $e->socket, $e->pid, $e->ready_line ...
#   $e->kill('KILL');  $e->restart;  $e->stop;   # stop: TERM, wait, returns the exit status
#   my ($rc, $out, $err) = Kvgate::Engine::run_cmd(@cmd);   # any command, to its end
#
# Binaries come from $BUILD/bin (default build), or $BUILD/asan/bin with KVGATE_ASAN=1 so
# that the ASan pass runs the engine and the CLI under the sanitizers too. The engine's
# stderr goes to "<socket>.log" (log() reads it). Processes still running when the test
# file ends are killed.

use strict;
use warnings;

use Carp qw(croak);
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Spec;
use IO::Select;
use POSIX qw(WNOHANG);
use Time::HiRes qw(sleep time);

my $parent_pid = $$;
my @live;

sub repo_root { return abs_path(File::Spec->catdir(dirname(abs_path(__FILE__)), '..', '..', '..')) }

sub shared_dir {
    return $ENV{KVGATE_SHARED} if $ENV{KVGATE_SHARED};
    return abs_path(File::Spec->catdir(repo_root(), '..', 'shared'));
}

sub asan { return ($ENV{KVGATE_ASAN} // '') eq '1' }

# The build folder: $BUILD (default build), absolute.
sub build_dir {
    my $build = $ENV{BUILD} || 'build';
    return File::Spec->file_name_is_absolute($build) ? $build : File::Spec->catdir(repo_root(), $build);
}

sub bin {
    my ($name) = @_;
    my $build = build_dir();
    my $asan = "$build/asan/bin/$name";
    return asan() && -x $asan ? $asan : "$build/bin/$name";
}

sub stories_args {
    my $d = shared_dir() . '/models/stories260K';
    return ('--model', "$d/stories260K.bin", '--tokenizer', "$d/tok512.bin");
}

# start(socket => PATH, args => [model args...] (default stories260K), extra => [...],
#       bin => another kvgate-engine binary (e.g. the emulated CUDA build))
sub start {
    my ($class, %o) = @_;
    my $self = bless { %o }, ref $class || $class;
    # a llama2.c checkpoint carries no chat template: the engine names the plain built-in
    $self->{args} //= [ stories_args(), '--chat-template', 'plain' ];
    $self->{extra} //= [];
    $self->_spawn;
    push @live, $self;
    return $self;
}

sub _spawn {
    my ($self) = @_;
    my $sock = $self->{socket} or croak 'socket => PATH is required';
    my @cmd = ($self->{bin} // bin('kvgate-engine'), @{ $self->{args} }, '--socket', $sock, '--socket-mode', '0666',
               '--threads', '1', @{ $self->{extra} });
    pipe(my $r, my $w) or croak "pipe: $!";
    my $pid = fork // croak "fork: $!";
    if ($pid == 0) {
        close $r;
        open STDIN, '<', '/dev/null';
        open STDOUT, '>&', $w;
        open STDERR, '>>', "$sock.log";
        # The engine must never inherit nginx's variables or ASan's leak-noise settings
        # meant for nginx; leave the caller's ASAN_OPTIONS (make test's) alone.
        delete $ENV{NGINX};
        exec @cmd or POSIX::_exit(127);
    }
    close $w;
    $self->{pid} = $pid;
    my $sel = IO::Select->new($r);
    my $line = '';
    my $deadline = time + (asan() ? 120 : 60);
    while (time < $deadline) {
        last if $line =~ /\n/;
        if ($sel->can_read(0.1)) {
            my $n = sysread($r, $line, 4096, length $line);
            last unless $n;
        }
        if (waitpid($pid, WNOHANG) == $pid) {
            $self->{pid} = undef;
            $self->{status} = $? >> 8;
            last;
        }
    }
    close $r;
    $self->{ready} = $line;
    croak "kvgate-engine did not start (@cmd):\n" . $self->log unless $line =~ /ready on/;
    return $self;
}

# Starts a fresh engine with the same arguments (after a kill or stop).
sub restart {
    my ($self, %o) = @_;
    $self->{args} = $o{args} if $o{args};
    $self->{extra} = $o{extra} if $o{extra};
    return $self->_spawn;
}

sub socket { return $_[0]{socket} }
sub pid { return $_[0]{pid} }
sub ready_line { return $_[0]{ready} }

sub log {
    my ($self) = @_;
    open my $fh, '<', "$self->{socket}.log" or return '';
    local $/;
    return scalar <$fh> // '';
}

# Sends a signal and leaves the process be (STOP, CONT): kill() waits for it to end.
sub signal {
    my ($self, $sig) = @_;
    return $self->{pid} ? CORE::kill($sig, $self->{pid}) : 0;
}

sub kill {
    my ($self, $sig) = @_;
    my $pid = $self->{pid} or return;
    CORE::kill($sig // 'KILL', $pid);
    waitpid $pid, 0;
    $self->{status} = $?;
    $self->{pid} = undef;
}

# TERM, wait up to $timeout s; returns the exit status (or -1 if it had to be killed).
sub stop {
    my ($self, $timeout) = @_;
    my $pid = $self->{pid} or return $self->{status} // 0;
    CORE::kill('TERM', $pid);
    my $deadline = time + ($timeout // 30);
    while (waitpid($pid, WNOHANG) != $pid) {
        if (time > $deadline) {
            CORE::kill('KILL', $pid);
            waitpid $pid, 0;
            $self->{pid} = undef;
            return -1;
        }
        sleep 0.02;
    }
    my $st = $?;
    $self->{pid} = undef;
    return ($st & 127) ? 128 + ($st & 127) : $st >> 8;
}

# Runs a command (stdin /dev/null) to its end: (exit status, stdout, stderr).
sub run_cmd {
    my (@cmd) = @_;
    require File::Temp;
    my ($ofh, $out) = File::Temp::tempfile(UNLINK => 1);
    my ($efh, $err) = File::Temp::tempfile(UNLINK => 1);
    my $pid = fork // croak "fork: $!";
    if (!$pid) {
        open STDIN, '<', '/dev/null';
        open STDOUT, '>&', $ofh;
        open STDERR, '>&', $efh;
        exec @cmd or POSIX::_exit(127);
    }
    waitpid $pid, 0;
    my $rc = $? >> 8;
    my @text = map { local $/; seek $_, 0, 0; scalar(<$_>) // '' } $ofh, $efh;
    return ($rc, @text);
}

END {
    if ($$ == $parent_pid) {
        local $?;
        for my $e (@live) {
            next unless $e->{pid};
            CORE::kill('KILL', $e->{pid});
            waitpid $e->{pid}, 0;
        }
    }
}

1;
