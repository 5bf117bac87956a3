package Kvgate::Phases;

# Timed phases of closed-loop client processes against a Kvgate::Gateway, for the
# benchmarks that ask what one kind of traffic costs another (t/bench/sc_pattern,
# t/bench/scrape). Prints figures; asserts nothing.
#
#   my $p = Kvgate::Phases->new($g, seconds => 15, wait => 120);
#   $p->phase('label', { name => 'ordinary', clients => 8, method => 'POST',
#                        path => '/v1/completions', body => sub { {...} } }, {...});
#
# Each client sends its group's request (body->(i) for the i-th; no body: a GET) until
# the phase ends, one line per answer into a file of its own. A request still running
# at the end is waited for up to `wait` s, then killed and counted as such. Per group:
# answers and their statuses, latency p50 / p99 / max; for the first group also the
# longest time with no answer; and the CPU the nginx workers used over the phase.

use strict;
use warnings;

use HTTP::Tiny;
use JSON::PP;
use POSIX ();
use Time::HiRes qw(time sleep);

sub new {
    my ($class, $g, %o) = @_;
    return bless { g => $g, seconds => $o{seconds} // 15, wait => $o{wait} // 120, n => 0 }, $class;
}

sub _client {
    my ($self, $file, $until, $grp) = @_;
    my $pid = fork // die "fork: $!";
    return $pid if $pid;
    my $port = $self->{g}->t->port(0);
    my $http = HTTP::Tiny->new(timeout => $self->{wait} + $self->{seconds}, keep_alive => 1);
    open my $out, '>', $file or POSIX::_exit(1);
    $out->autoflush(1);
    my $i = 0;
    while (time < $until) {
        my $t0 = time;
        my $r = $grp->{body}
            ? $http->request($grp->{method} // 'POST', "http://127.0.0.1:$port$grp->{path}",
                             { headers => { 'Content-Type' => 'application/json' },
                               content => encode_json($grp->{body}->($i++)) })
            : $http->get("http://127.0.0.1:$port$grp->{path}");
        printf $out "%.6f %.6f %d\n", $t0, time, $r->{status};
    }
    close $out;
    POSIX::_exit(0);
}

sub _lines {
    my ($file) = @_;
    open my $in, '<', $file or return ();
    return map { [ split ] } <$in>;
}

sub pct {
    my ($p, @v) = @_;
    return 0 unless @v;
    @v = sort { $a <=> $b } @v;
    return $v[ int($p * $#v + 0.5) ];
}

# utime + stime of the nginx workers, in seconds
sub workers_cpu {
    my ($self) = @_;
    my $t = 0;
    for my $pid ($self->{g}->worker_pids) {
        open my $f, '<', "/proc/$pid/stat" or next;
        my @f = split ' ', (<$f> =~ s/^.*\) //r);
        $t += ($f[11] + $f[12]) / POSIX::sysconf(POSIX::_SC_CLK_TCK());
    }
    return $t;
}

sub phase {
    my ($self, $label, @groups) = @_;
    my $dir = $self->{g}->t->prefix;
    my $run = ++$self->{n};
    my $start = time;
    my $until = $start + $self->{seconds};
    my $cpu0 = $self->workers_cpu;
    my (%left, %files);
    for my $grp (@groups) {
        for my $c (1 .. $grp->{clients}) {
            my $file = "$dir/phase$run-$grp->{name}-$c";
            push @{ $files{ $grp->{name} } }, $file;
            $left{ $self->_client($file, $until, $grp) } = $grp->{name};
        }
    }
    my $deadline = $until + $self->{wait};
    while (%left && time < $deadline) {
        for my $p (keys %left) {
            delete $left{$p} if waitpid($p, POSIX::WNOHANG()) > 0;
        }
        sleep 0.1;
    }
    my $cpu = $self->workers_cpu - $cpu0;
    my %killed;
    $killed{$_}++ for values %left;
    kill 'KILL', keys %left;
    waitpid($_, 0) for keys %left;
    my $end = time;

    my %stats;
    for my $i (0 .. $#groups) {
        my $grp = $groups[$i];
        my @ans = map { _lines($_) } @{ $files{ $grp->{name} } };
        my @lat = map { ($_->[1] - $_->[0]) * 1000 } @ans;
        my %st;
        $st{ $_->[2] }++ for @ans;
        my $line = sprintf "%-24s %-10s %6d answers (%s), latency p50 %8.1f ms, p99 %8.1f ms, max %8.1f ms",
            $i ? '' : $label, "$grp->{name}:", scalar @ans,
            join(', ', map { "$st{$_} x $_" } sort keys %st) || 'none',
            pct(0.5, @lat), pct(0.99, @lat), pct(1, @lat);
        if ($i == 0) {
            my @ends = sort { $a <=> $b } ($start, (grep { $_ <= $until } map { $_->[1] } @ans), $until);
            my $gap = 0;
            for my $k (1 .. $#ends) {
                $gap = $ends[$k] - $ends[$k - 1] if $ends[$k] - $ends[$k - 1] > $gap;
            }
            $line .= sprintf "; longest gap without an answer %.2f s", $gap;
        }
        $line .= sprintf "; %d still running %.0f s after the phase (killed)", $killed{ $grp->{name} }, $end - $until
            if $killed{ $grp->{name} };
        print "$line\n";
        $stats{ $grp->{name} } = { answers => scalar @ans, statuses => \%st };
    }
    printf "%-24s %-10s %.2f s of CPU over %.1f s\n", '', 'workers:', $cpu, $end - $start;
    $stats{cpu} = $cpu;
    return \%stats;
}

1;
