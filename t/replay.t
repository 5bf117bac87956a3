#!/usr/bin/perl
# kvgate-replay (tools/kvgate-replay.c) against a real gateway: its figures agree with
# the gateway's own counters (requests, prompt and cached tokens); the same seed sends
# the same conversations, streamed or not (so the streamed answers were reassembled
# exactly: the next turn's prompt carries them); shared system prompts and growing
# chats hit the cache; errors are counted by status.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Kvgate::Engine;
use Kvgate::Gateway;

my $g = Kvgate::Gateway->new;
my $port = $g->t->port;
my $bin = Kvgate::Engine::bin('kvgate-replay');
# Small chats: stories260K's context is 512 tokens.
my @work = ('--tenants', 5, '--system-tokens', '60..150', '--user-tokens', '5..15', '--turns', 3,
            '--max-tokens', 8, '--context', 450);

sub replay {
    my (@args) = @_;
    my @cmd = ($bin, '--url', "http://127.0.0.1:$port", @work, '--json', @args);
    open my $fh, '-|', @cmd or die "$bin: $!";
    my $out = do { local $/; <$fh> };
    close $fh;
    my $rc = $? >> 8;
    my $j = eval { JSON::PP->new->decode($out) } // {};
    return ($j, $rc);
}

sub sum_series {
    my ($text, $re) = @_;
    my $s = 0;
    for (split /\n/, $text) {
        $s += $1 if /^$re (\d+)$/;
    }
    return $s;
}

sub chat_200 { return sum_series($_[0], qr/kvgate_requests_total\{endpoint="chat",[^}]*status="200"\}/) }
sub prompt_total { return sum_series($_[0], qr/kvgate_prompt_tokens_total\{[^}]*\}/) }
sub cached_total { return sum_series($_[0], qr/kvgate_cached_tokens_total\{[^}]*\}/) }

# ---- concurrent clients: the figures are the gateway's -----------------------------------

my ($a, $rc) = replay('--requests', 30, '--concurrency', 4, '--seed', 7);
is($rc, 0, 'exit status 0');
is($a->{requests}, 30, '30 requests sent');
is($a->{ok}, 30, '  all answered 200');
is_deeply($a->{errors}, {}, '  no errors');
ok($a->{prompt_tokens} > 30 * 60, "prompt tokens counted ($a->{prompt_tokens})");
ok($a->{cached_tokens} > 0, "shared system prompts and growing chats hit ($a->{cached_tokens})");
ok(abs($a->{hit_rate} - $a->{cached_tokens} / $a->{prompt_tokens}) < 1e-9, 'hit rate = cached / prompt');
ok($a->{completion_tokens} > 0 && $a->{completion_tokens} <= 30 * 8, 'completion tokens: at most max_tokens each');
ok($a->{ttft_p50_s} > 0 && $a->{ttft_p50_s} <= $a->{ttft_p99_s}, 'TTFT p50 <= p99');
ok($a->{ttft_p99_s} <= $a->{latency_p99_s} + 1e-9, 'TTFT within the latency');
ok($a->{requests_per_s} > 0, 'requests/s');

my $m = $g->wait_metrics(sub { chat_200($_[0]) >= 30 }, 'the 30 chat requests counted');
is(chat_200($m), 30, 'the gateway counted 30 chat requests');
is(prompt_total($m), $a->{prompt_tokens}, 'and the same prompt tokens');
is(cached_total($m), $a->{cached_tokens}, 'and the same cached tokens');
is(sum_series($m, qr/kvgate_completion_tokens_total\{[^}]*\}/), $a->{completion_tokens}, 'and the same completion tokens');

# ---- one client: the same seed sends the same conversations ------------------------------

my ($s1) = replay('--requests', 12, '--concurrency', 1, '--seed', 3);
my ($s2) = replay('--requests', 12, '--concurrency', 1, '--seed', 3, '--no-stream');
my ($s3) = replay('--requests', 12, '--concurrency', 1, '--seed', 4);
is($s1->{ok}, 12, 'one client, streamed: 12 answered');
is($s2->{ok}, 12, 'one client, not streamed: 12 answered');
is($s2->{prompt_tokens}, $s1->{prompt_tokens},
   'the same seed: the same prompts, streamed or not (the streamed answers reassembled exactly)');
ok($s2->{cached_tokens} >= $s1->{cached_tokens}, 'and the second run hits at least as much');
isnt($s3->{prompt_tokens}, $s1->{prompt_tokens}, 'another seed: another workload');
is($s2->{ttft_p50_s}, 0, 'no TTFT without streaming');

$m = $g->wait_metrics(sub { chat_200($_[0]) >= 66 }, 'all 66 chat requests counted');
is(prompt_total($m), $a->{prompt_tokens} + $s1->{prompt_tokens} + $s2->{prompt_tokens} + $s3->{prompt_tokens},
   'the gateway counted every prompt token');

# ---- open loop: Poisson arrivals at --rate -------------------------------------------------

my ($o) = replay('--requests', 12, '--concurrency', 1, '--seed', 3, '--rate', 8);
is($o->{ok}, 12, 'open loop at 8/s: 12 answered');
is($o->{prompt_tokens}, $s1->{prompt_tokens}, '  the same conversations as the closed loop (arrivals have their own stream)');
is($o->{rate}, 8, '  the rate reported');
# 11 exponential gaps of mean 1/8 s: fixed by the seed, far from 0 (and from the 60 s timeout)
ok($o->{arrival_span_s} > 0.2 && $o->{arrival_span_s} < 20, "  the last arrival at $o->{arrival_span_s} s");
# (the replayer checks every send against its arrival time; elapsed_s is measured from the
# first request's send, which may itself go out a little late, so it is no bound)
is($o->{early}, 0, "  no request went out before its time (ran $o->{elapsed_s} s)");
ok($o->{late} >= 0 && $o->{late} <= 12, "  late requests counted ($o->{late})");
my ($o2) = replay('--requests', 12, '--concurrency', 1, '--seed', 3, '--rate', 8);
is($o2->{arrival_span_s}, $o->{arrival_span_s}, '  the same seed: the same arrival times');
is($s1->{arrival_span_s}, 0, '  closed loop: no arrival times');

# ---- warm-up: sent, left out of the figures ---------------------------------------------------

my ($w) = replay('--requests', 12, '--concurrency', 1, '--seed', 3, '--warmup', 5);
my ($s17) = replay('--requests', 17, '--concurrency', 1, '--seed', 3);
is($w->{requests}, 12, 'warm-up 5 + 12: 12 requests in the figures');
is($w->{ok}, 12, '  12 answered');
is($w->{warmup}, 5, '  the warm-up reported');
# one client: the same 17 requests in the same order; the figures are the last 12's
ok($w->{prompt_tokens} < $s17->{prompt_tokens} && $w->{prompt_tokens} > 0,
   "  their prompt tokens only ($w->{prompt_tokens} of $s17->{prompt_tokens})");

$m = $g->wait_metrics(sub { chat_200($_[0]) >= 90 + 34 }, 'all 124 chat requests counted');
is(chat_200($m), 124, '  the gateway answered the warm-up too');

# ---- errors by status ---------------------------------------------------------------------

my ($e, $erc) = replay('--requests', 3, '--concurrency', 1, '--model', 'no-such-model');
is($e->{ok}, 0, 'an unknown model: nothing answered 200');
is($e->{requests}, 3, '  3 requests sent');
is_deeply($e->{errors}, { 404 => 3 }, '  3 errors counted by status 404');
is($erc, 1, '  exit status 1');

$g->stop;
done_testing;
