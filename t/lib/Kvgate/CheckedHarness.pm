package Kvgate::CheckedHarness;

# The harness `make test` runs prove with (prove --harness Kvgate::CheckedHarness): a
# TAP::Harness that also fails the run when a test skips, unless the skip is on the
# short list in t/skips-allowed. A skipped check is a check that cannot fail; the list
# says which skips are by design (the ASan pass of what has no ASan build, a machine
# with a GPU) and why.
#
# Both kinds count: a whole file (plan skip_all) and a SKIP block's tests (ok N # skip).

use strict;
use warnings;

use File::Basename qw(dirname);
use File::Spec;

use parent 'TAP::Harness';

sub _allowed {
    my $file = File::Spec->catfile(dirname(__FILE__), '..', '..', 'skips-allowed');
    open my $fh, '<', $file or die "$file: $!";
    my @rules;
    while (<$fh>) {
        next if /^\s*(#|$)/;
        chomp;
        my ($test, $pass, $re) = split /\s+/, $_, 3;
        die "$file:$.: 'TEST PASS REASON-REGEX' expected\n" unless defined $re && $pass =~ /^(plain|asan|any)$/;
        push @rules, { test => $test, pass => $pass, re => qr/$re/, line => $. };
    }
    return @rules;
}

sub new {
    my ($class, @args) = @_;
    my $self = $class->SUPER::new(@args);
    $self->{kvg_skips} = [];
    $self->callback(made_parser => sub {
        my ($parser, $job) = @_;
        my $test = $job->[0];
        $parser->callback(plan => sub {
            my $plan = shift;
            push @{ $self->{kvg_skips} }, [ $test, $plan->explanation // '' ] if $plan->has_skip;
        });
        $parser->callback(test => sub {
            my $r = shift;
            push @{ $self->{kvg_skips} }, [ $test, $r->explanation // '' ] if $r->has_skip;
        });
    });
    return $self;
}

sub runtests {
    my ($self, @tests) = @_;
    my $aggregator = $self->SUPER::runtests(@tests);
    my $pass = ($ENV{KVGATE_ASAN} // '') eq '1' ? 'asan' : 'plain';
    my @rules = _allowed();
    my @bad;
    for my $s (@{ $self->{kvg_skips} }) {
        my ($test, $why) = @$s;
        my $ok = grep { $test eq $_->{test} && ($_->{pass} eq 'any' || $_->{pass} eq $pass) && $why =~ $_->{re} }
                 @rules;
        push @bad, "$test: $why" unless $ok;
    }
    if (@bad) {
        print "Failed skip check ($pass pass): these tests skipped, and t/skips-allowed does not allow it:\n";
        print "    $_\n" for @bad;
        print "Result: FAIL (a skipped check cannot fail: make it run, or allow the skip in t/skips-allowed and say why)\n";
        exit 1;
    }
    return $aggregator;
}

1;
