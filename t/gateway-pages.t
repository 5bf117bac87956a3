#!/usr/bin/perl
# The kvgate_metrics and kvgate_status pages are rendered at most once per
# kvgate_page_refresh and shared by every worker (issue 26: 50 scrapers took 22% of the
# serving throughput of 2 cores). Real nginx (two workers), real engine:
#   - a location with a long refresh serves the same page, whichever worker answers,
#     while the counters it shows have moved (the uncached page shows them);
#   - a short refresh renders anew: the change shows up within the deadline;
#   - the default (1s) location answers, the JSON and the text both;
#   - counters never go back from one read to the next on the default location.
# The cost per scrape is measured by t/bench/scrape, never asserted here.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Kvgate::Gateway;

my $g = Kvgate::Gateway->new(locations => <<'EOF');
        location = /held/metrics { kvgate_metrics; kvgate_page_refresh 1h; }
        location = /held/status { kvgate_status; kvgate_page_refresh 1h; }
        location = /brief/metrics { kvgate_metrics; kvgate_page_refresh 200ms; }
        location = /default/metrics { kvgate_metrics; kvgate_page_refresh 1s; }
        location = /default/status { kvgate_status; }
EOF
my $t = $g->t;

# A page's body, read on a connection of its own (so either worker may answer).
sub get_body {
    my ($path) = @_;
    my ($r) = Kvgate::Test->parse_responses($t->raw("GET $path HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    return $r && $r->{status} == 200 ? $r->{body} : 'status ' . ($r ? $r->{status} : 'none');
}

sub reads {
    my ($path, $n) = @_;
    return map { get_body($path) } 1 .. $n;
}

my $requests = sub { $g->metric($_[0], 'kvgate_requests_total{endpoint="completions",bucket="bypass",status="200"}') };

# ---- held: the same page, however often and by whichever worker --------------------------

my $held_m = get_body('/held/metrics');
my $held_s = get_body('/held/status');
like($held_m, qr/^# HELP kvgate_requests_total/m, 'the held metrics page');
ok(eval { decode_json($held_s) }, 'the held status page is JSON');
my $before = $requests->($held_m);

is($g->completion({ prompt => 'Once upon a time', max_tokens => 2 })->{status}, 200, 'a completion');
my $fresh = $g->wait_metrics(sub { $requests->($_[0]) > $before }, 'the uncached page counts it');
ok($requests->($fresh) > $before, 'the uncached page (kvgate_page_refresh 0) shows the completion');

my @m = reads('/held/metrics', 8);
is(scalar(grep { $_ eq $held_m } @m), 8, 'kvgate_page_refresh 1h: 8 reads, each the page first rendered');
my @s = reads('/held/status', 8);
is(scalar(grep { $_ eq $held_s } @s), 8, '  and the status page too');
is($t->request('HEAD', '/held/metrics')->{status}, 200, '  HEAD answers');

# ---- brief: rendered anew once the refresh has passed ----------------------------------

{
    my $first = get_body('/brief/metrics');
    my $n0 = $requests->($first);
    is($g->completion({ prompt => 'Once upon a time', max_tokens => 2 })->{status}, 200, 'another completion');
    my $seen;
    ok($t->wait_for(sub { $seen = get_body('/brief/metrics'); $requests->($seen) > $n0 },
                    'the 200ms page to show it'),
       'kvgate_page_refresh 200ms: the completion shows up');
}

# ---- the default: answers, and counters only go up ---------------------------------------

{
    like(get_body('/default/metrics'), qr/^kvgate_requests_total/m, 'kvgate_page_refresh 1s: the metrics page');
    my $j = eval { decode_json(get_body('/default/status')) } // {};
    ok($j->{gateway}, '  the status page (the default refresh)');
    my ($prev, $back) = (0, 0);
    for my $i (1 .. 30) {
        $g->completion({ prompt => "Once upon a time $i", max_tokens => 1 });
        my $n = $requests->(get_body('/default/metrics'));
        $back++ if $n < $prev;
        $prev = $n;
    }
    is($back, 0, '30 completions and reads on new connections: the counter never went back');
}

$g->stop;
done_testing;
