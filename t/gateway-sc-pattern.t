#!/usr/bin/perl
# A client's answer_pattern cannot hold the worker (issue: ReDoS in answer_pattern). The
# pattern runs in nginx's event loop; libkvgate counts every step PCRE2 takes and abandons
# the match at kvgate_answer_pattern_steps (answer_re.h). Real nginx, real engine,
# stories260K, fixed seeds:
#   - backtracking patterns (exponential at every start, PCRE2's own match limit, nested
#     repeats) end the request with a 422 naming kvgate.answer_pattern, plain and streamed,
#     never a 200 with a vote that silently lost samples; $kvgate_answer_steps shows the
#     work stopped just past the sample's budget;
#   - two at once, with ordinary requests between them: every ordinary request answered;
#   - the directive: a location with a small budget refuses what the default one answers;
#   - the refusals are counted (metrics, status page).
# Latency under such load is measured by t/bench/sc_pattern, never asserted here.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Kvgate::Gateway;

my $g = Kvgate::Gateway->new(
    http => q{log_format pat '$status steps=$kvgate_answer_steps sc=$kvgate_samples u=$request_uri';},
    server => 'access_log %%PREFIX%%/logs/pat.log pat;',
    locations => "        location /tight/v1/ { kvgate_pass; kvgate_answer_pattern_steps 1000 2000; }\n",
);

my $story = 'Lily and Tom went to the park. They saw a big dog. The dog ran to';
my %base = (prompt => $story, max_tokens => 60, temperature => 1.0, n => 16, seed => 7);
my $sample_budget = 1_000_000;    # the default (answer_re.h)

# The access-log line of the next completion request, once it is written (the log phase
# runs after the response).
my $seen = 0;
sub next_log {
    my @lines = $g->t->wait_log('logs/pat.log', qr{ u=/(?:tight/)?v1/}, count => ++$seen);
    return $lines[$seen - 1] // '';
}

# ---- hostile patterns: a 422, never a silent vote ----------------------------------------

# the issue's probe: n=16, long samples
my %long = (%base, max_tokens => 300);
my @hostile = (
    [ '(?s)(?:.|.){1,14}\d{9}|(.)', 'exponential at every start position' ],
    [ '(?s)(?:.|.){1,20}\x00|(.)', "the issue's probe, ~122 s a sample before" ],
    [ '(.*a){25}', "PCRE2's own match limit on every sample before: a silent null vote" ],
    [ '(?:\s*\w*)*(\d{9})', 'nested unbounded repeats' ],
);

for my $h (@hostile) {
    my ($pattern, $what) = @$h;
    my $r = $g->completion({ %long, kvgate => { vote => 'majority', answer_pattern => $pattern } });
    my ($steps) = next_log() =~ /steps=(\d+)/;
    is($r->{status}, 422, "$pattern ($what): 422") or diag("$steps steps: $r->{body}");
    is($r->{json}{error}{param}, 'kvgate.answer_pattern', '  param kvgate.answer_pattern');
    is($r->{json}{error}{code}, 'answer_pattern_too_costly', '  code answer_pattern_too_costly');
    is($r->{json}{error}{type}, 'invalid_request_error', '  invalid_request_error');
    like($r->{json}{error}{message}, qr/more than 1000000 matching steps on one sample/, '  the message says why');
    ok($steps > $sample_budget && $steps <= $sample_budget + 4097,
       "  \$kvgate_answer_steps $steps: stopped just past one sample's budget");
}

# streamed: the stream has begun (200) and ends with the error event
{
    my ($code, $h, $ev) = $g->stream('/v1/completions', { %base, max_tokens => 30,
        kvgate => { vote => 'majority', answer_pattern => '(?s)(?:.|.){1,14}\d{9}|(.)' } });
    next_log();
    is($code, 200, 'streamed: the stream began');
    my ($err) = grep { ref $_ && $_->{error} } @$ev;
    ok($err, '  it ends with an error event');
    is($err && $err->{error}{code}, 'answer_pattern_too_costly', '  answer_pattern_too_costly');
    is($err && $err->{error}{param}, 'kvgate.answer_pattern', '  naming kvgate.answer_pattern');
    ok(!grep({ !ref $_ && $_ eq 'DONE' } @$ev), '  and no [DONE]');
    ok(!grep({ ref $_ && $_->{kvgate} } @$ev), '  nor a vote');
}

# ---- two at once, ordinary requests between them -----------------------------------------

{
    my @socks = map {
        $g->send_raw('/v1/completions', { model => $Kvgate::Gateway::MODEL, %base, seed => 100 + $_,
            kvgate => { vote => 'majority', answer_pattern => '(?s)(?:.|.){1,14}\d{9}|(.)' } })
    } 1 .. 2;
    my $ordinary = 0;
    for my $i (1 .. 10) {
        my $r = $g->completion({ prompt => "Once upon a time $i", max_tokens => 8, temperature => 0 });
        $ordinary++ if $r->{status} == 200 && length $r->{json}{choices}[0]{text};
        next_log();
    }
    is($ordinary, 10, 'two hostile requests in flight: 10 of 10 ordinary requests answered');
    for my $s (@socks) {
        my ($status, undef, $body) = $g->parse_http($g->read_all($s, 60));
        close $s;
        is($status, 422, '  a hostile one: 422');
        like($body, qr/answer_pattern_too_costly/, '  answer_pattern_too_costly');
        next_log();
    }
}

# ---- the directive ------------------------------------------------------------------------

{
    my %req = (%base, max_tokens => 100, kvgate => { vote => 'majority', answer_pattern => '(\w+)' });
    my $r = $g->completion(\%req);
    my ($steps) = next_log() =~ /steps=(\d+)/;
    is($r->{status}, 200, "(\\w+), n=16, the default budget: 200 ($steps steps)");
    ok($steps > 2 * 2000, '  twice the steps the tight location allows a request');
    my $t = $g->post('/tight/v1/completions', { model => $Kvgate::Gateway::MODEL, %req });
    next_log();
    is($t->{status}, 422, 'the same under kvgate_answer_pattern_steps 1000 2000: 422');
    like($t->{json}{error}{message}, qr/more than (1000 matching steps on one sample|2000 matching steps over this request's samples)/,
         '  the message names the budget that ran out');
}

# ---- counted ------------------------------------------------------------------------------

{
    my $m = $g->wait_metrics(sub { $g->metric($_[0], 'kvgate_sc_answer_pattern_refusals_total') >= 5 },
                             'the refusals counted');
    ok($g->metric($m, 'kvgate_sc_answer_pattern_refusals_total') >= 5, 'kvgate_sc_answer_pattern_refusals_total');
    ok($g->status->{gateway}{self_consistency}{answer_pattern_refusals} >= 5, '  and on the status page');
}

$g->stop;
done_testing;
