#!/usr/bin/perl
# Self-consistency through the gateway (the body's "kvgate" object), stories260K,
# fixed seeds (real nginx, real engine):
#   - the vote equals the majority this test computes itself from the returned choices,
#     with an answer_pattern (names) and with the default extractor (the last number,
#     else the last non-empty line), streamed and not (the vote's own final chunk);
#   - a logprob vote changes the winner in a case found among fixed seeds;
#   - early stopping (min_samples 3, agreement 0.6, greedy samples that all agree): fewer
#     completion tokens than the full run, the same answer, the engine's dropped /
#     cancelled samples moved, chat streams open later waves with the role;
#   - stopped_early (and its counter) only when a sample was cancelled or never drawn;
#   - the document is prefilled once for n samples;
#   - every bad input is a 400 naming its parameter and the engine saw nothing;
#   - $kvgate_samples / $kvgate_vote_answer and the kvgate_sc_* metrics.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use List::Util qw(sum);
use Test::More;
use Kvgate::Gateway;

my $g = Kvgate::Gateway->new(
    http => q{log_format sc '$status sc=$kvgate_samples va="$kvgate_vote_answer" g=$kvgate_completion_tokens';},
    server => 'access_log %%PREFIX%%/logs/sc.log sc;',
);

# ---- the rules, written again here from docs/self-consistency.md -----------------------

# Normalized: trimmed, case-folded, trailing punctuation (and closing quotes/brackets)
# stripped. The answers this test meets are ASCII.
sub norm {
    my ($s) = @_;
    $s =~ s/^\s+//;
    $s =~ s/\s+$//;
    $s = lc $s;
    1 while $s =~ s/[.,;:!?"')\]}]+$// || $s =~ s/\s+$//;
    return $s;
}

# Capture 1 of the last match of $re in $text (matches one after the other).
sub last_capture {
    my ($re, $text) = @_;
    my $ans;
    while ($text =~ /$re/g) {
        $ans = $1 if defined $1;
    }
    return $ans;
}

# The default extractor: the last number (sign, digits, decimals), else the last
# non-empty line.
sub default_answer {
    my ($text) = @_;
    my $n = last_capture(qr/([-+]?\d+(?:\.\d+)?)/, $text);
    return $n if defined $n;
    my @lines = grep { /\S/ } split /\n/, $text;
    return @lines ? $lines[-1] : undef;
}

# The only answer extraction is on the last 4 KiB of a text; these texts are short.
sub answer_of {
    my ($pattern, $text) = @_;
    my $a = defined $pattern ? last_capture(qr/$pattern/, $text) : default_answer($text);
    return undef unless defined $a;
    $a = norm($a);
    return length $a ? $a : undef;
}

# The tally and the winner: larger weight, then larger count, then the answer whose
# first vote came from the lowest sample index. @$weights undef: a majority vote.
sub tally {
    my ($answers, $weights) = @_;
    my (%w, %c, %first);
    for my $i (0 .. $#$answers) {
        my $a = $answers->[$i];
        next unless defined $a;
        $w{$a} += $weights ? $weights->[$i] : 1;
        $c{$a}++;
        $first{$a} //= $i;
    }
    my ($win) = sort { $w{$b} <=> $w{$a} || $c{$b} <=> $c{$a} || $first{$a} <=> $first{$b} } keys %w;
    return ($win, \%w, \%c);
}

sub mean_logprob {
    my ($lps) = @_;
    return @$lps ? sum(@$lps) / @$lps : 0;
}

sub approx { my ($a, $b) = @_; return abs($a - $b) <= 1e-3 * (1 + abs $b) }

my $names = '(Lily|Tom|Ben|Sue|Max|Anna|Sam|Mia|Tim)';
my $story = 'Lily and Tom went to the park. They saw a big dog. The dog ran to';

# ---- a majority vote with a pattern, not streamed ------------------------------------------

my %base = (prompt => $story, max_tokens => 40, temperature => 1.0, n => 8, seed => 42);
my ($plain_texts, $plain_answer);
{
    my $r = $g->completion({ %base, kvgate => { vote => 'majority', answer_pattern => $names } });
    is($r->{status}, 200, 'vote majority, pattern: 200') or diag($r->{body});
    my $j = $r->{json};
    my @ch = @{ $j->{choices} };
    is(scalar @ch, 8, '  all 8 samples ran (no min_samples)');
    is_deeply([ map { $_->{index} } @ch ], [ 0 .. 7 ], '  in index order');
    my @answers = map { answer_of($names, $_->{text}) } @ch;
    my ($win, $w) = tally(\@answers);
    ok(defined $win, "  the samples name someone (@{[ join ',', map { $_ // '-' } @answers ]})");
    is($j->{kvgate}{answer}, $win, "  the answer is the test's own majority ($win)");
    is_deeply($j->{kvgate}{votes}, $w, '  the votes are its tally');
    is($j->{kvgate}{samples}, 8, '  samples: 8');
    ok(!$j->{kvgate}{stopped_early}, '  not stopped early');
    ok($j->{usage}{completion_tokens} > 0 && $j->{usage}{completion_tokens} <= 8 * 40,
       "  usage: $j->{usage}{completion_tokens} completion tokens");
    ok(!defined $ch[0]{logprobs}, '  no logprobs when not asked for');
    $plain_texts = [ map { $_->{text} } @ch ];
    $plain_answer = $win;

    my $line = $g->t->wait_log('logs/sc.log', qr/va="\Q$win\E"/);
    like($line // '', qr/^200 sc=8 va="\Q$win\E" g=\d+$/, '  $kvgate_samples and $kvgate_vote_answer logged')
        or diag($line);

    # The same request without the vote: the same samples (the vote only reads them).
    my $p = $g->completion({ %base });
    is_deeply([ map { $_->{text} } @{ $p->{json}{choices} } ], $plain_texts,
              '  the samples are those of the same request without a vote');
    ok(!exists $p->{json}{kvgate}, '  which has no kvgate object');
    my $none = $g->t->wait_log('logs/sc.log', qr/^200 sc=- va="-"/);
    ok($none, '  and logs both variables empty ("-")');
}

# ---- streamed: the same vote, in a final chunk before the usage chunk -------------------------

{
    my ($st, $h, $ev) = $g->stream('/v1/completions', { %base,
        stream_options => { include_usage => JSON::PP::true },
        kvgate => { vote => 'majority', answer_pattern => $names } });
    is($st, 200, 'streamed vote: 200');
    is($ev->[-1], 'DONE', '  ends with [DONE]');
    my $vote = $ev->[-3];
    is_deeply($vote->{choices}, [], '  the vote chunk has no choices');
    is($vote->{kvgate}{answer}, $plain_answer, '  and the same answer as not streamed');
    ok(exists $vote->{usage} && !defined $vote->{usage}, '  "usage": null in it (include_usage)');
    ok($ev->[-2]{usage}{completion_tokens} > 0, '  the usage chunk is the last before [DONE]');
    my @texts = $g->stream_texts($ev);
    is_deeply(\@texts, $plain_texts, '  the samples stream as they do not streamed');
    my ($win) = tally([ map { answer_of($names, $_) } @texts ]);
    is($vote->{kvgate}{answer}, $win, "  the test's majority of the streamed texts");
    is(scalar(grep { ref $_ && exists $_->{kvgate} } @$ev), 1, '  one chunk carries the vote');
}

# ---- the default extractor: the last number, else the last non-empty line -----------------------

{
    # greedy: every sample is the same text, so the answer is its last line / number
    for my $case ([ 'Lily had 3 red balls and 2 blue balls. She gave', 'number or line' ],
                  [ "Tom said:\nOnce upon a time", 'line' ]) {
        my ($prompt, $what) = @$case;
        my $r = $g->completion({ prompt => $prompt, max_tokens => 48, temperature => 0, n => 3,
                                 kvgate => { vote => 'majority' } });
        is($r->{status}, 200, "default extractor ($what): 200") or diag($r->{body});
        my @texts = map { $_->{text} } @{ $r->{json}{choices} };
        my $want = answer_of(undef, $texts[0]);
        is($r->{json}{kvgate}{answer}, $want, "  the answer is the default one: " . ($want // 'null'));
        is_deeply($r->{json}{kvgate}{votes}, defined $want ? { $want => 3 } : {}, '  three votes for it');
    }
    # A number in the text wins over the lines after it; a text with none, its last line.
    my @found;
    for my $seed (1 .. 40) {
        my $r = $g->completion({ prompt => 'One, two, three, four. The number is', max_tokens => 24,
                                 temperature => 1.0, seed => $seed, n => 4, kvgate => { vote => 'majority' } });
        my @texts = map { $_->{text} } @{ $r->{json}{choices} };
        my @ans = map { answer_of(undef, $_) } @texts;
        my ($win) = tally(\@ans);
        push @found, [ $seed, $r->{json}{kvgate}{answer}, $win, scalar grep { /\d/ } @texts ];
    }
    my @bad = grep { ($_->[1] // '') ne ($_->[2] // '') } @found;
    is(scalar @bad, 0, 'default extractor over 40 seeds: the answer is always the test\'s')
        or diag(explain(\@bad));
    note('samples with a digit: ' . sum(map { $_->[3] } @found));
}

# ---- a logprob vote changes the winner ------------------------------------------------------------

{
    my $pattern = '(\w+)\W*$';          # the last word
    my ($found, $maj, $lpw);
    for my $seed (1 .. 80) {
        my $r = $g->completion({ prompt => $story, max_tokens => 4, temperature => 1.3, n => 7, seed => $seed,
                                 logprobs => 0, kvgate => { vote => 'majority', answer_pattern => $pattern } });
        my @ch = @{ $r->{json}{choices} };
        my @ans = map { answer_of($pattern, $_->{text}) } @ch;
        my @wt = map { exp(mean_logprob($_->{logprobs}{token_logprobs})) } @ch;
        my ($m, undef, $mc) = tally(\@ans);
        my ($l) = tally(\@ans, \@wt);
        next unless defined $m && defined $l && $m ne $l;
        # a clear majority (not a tie on count), so the weighting is what changes it
        my @counts = sort { $b <=> $a } values %$mc;
        next unless @counts > 1 && $counts[0] > $counts[1];
        $found = $seed;
        ($maj, $lpw) = ($m, $l);
        is($r->{json}{kvgate}{answer}, $m, "seed $seed: the majority vote says \"$m\"");
        last;
    }
    ok($found, 'a seed where logprob weighting changes the winner');
    SKIP: {
    skip 'no seed found', 6 unless $found;
    my $r = $g->completion({ prompt => $story, max_tokens => 4, temperature => 1.3, n => 7, seed => $found,
                             logprobs => 0, kvgate => { vote => 'logprob', answer_pattern => $pattern } });
    is($r->{json}{kvgate}{answer}, $lpw, "  the logprob vote says \"$lpw\"");
    my @ch = @{ $r->{json}{choices} };
    my @ans = map { answer_of($pattern, $_->{text}) } @ch;
    my (undef, $w) = tally(\@ans, [ map { exp(mean_logprob($_->{logprobs}{token_logprobs})) } @ch ]);
    my $v = $r->{json}{kvgate}{votes};
    is_deeply([ sort keys %$v ], [ sort keys %$w ], '  its votes name the same answers');
    ok(!grep({ !approx($v->{$_}, $w->{$_}) } keys %$w), '  with the weights the test computes')
        or diag(explain($v, $w));
    my $nl = $g->completion({ prompt => $story, max_tokens => 4, temperature => 1.3, n => 7, seed => $found,
                              kvgate => { vote => 'logprob', answer_pattern => $pattern } });
    is($nl->{json}{kvgate}{answer}, $lpw, '  the same without logprobs asked for');
    ok(!defined $nl->{json}{choices}[0]{logprobs}, '  which are then not returned');
    }
}

# ---- early stopping ------------------------------------------------------------------------------

{
    my %req = (prompt => $story, max_tokens => 30, temperature => 0, n => 10);
    my $full = $g->completion({ %req, kvgate => { vote => 'majority' } });
    is($full->{json}{kvgate}{samples}, 10, 'greedy n=10, no min_samples: 10 samples');
    my $s0 = $g->status;
    my $early = $g->completion({ %req, kvgate => { vote => 'majority', min_samples => 3, agreement => 0.6 } });
    is($early->{status}, 200, 'min_samples 3, agreement 0.6: 200') or diag($early->{body});
    my $k = $early->{json}{kvgate};
    is($k->{answer}, $full->{json}{kvgate}{answer}, "  the answer equals the full run's");
    ok($k->{stopped_early}, '  stopped early');
    ok($k->{samples} < 10, "  $k->{samples} samples drawn of 10");
    ok($early->{json}{usage}{completion_tokens} < $full->{json}{usage}{completion_tokens},
       "  fewer completion tokens ($early->{json}{usage}{completion_tokens} < "
       . "$full->{json}{usage}{completion_tokens})");
    my @ch = @{ $early->{json}{choices} };
    is(scalar @ch, $k->{samples}, '  one choice per sample drawn');
    my @done = grep { $_->{finish_reason} ne 'cancelled' } @ch;
    is(sum(map { $_ } values %{ $k->{votes} }), scalar @done, '  each finished sample voted');
    my $s1 = $g->wait_status(sub {
        ($_[0]{samples}{dropped} // 0) + ($_[0]{samples}{cancelled} // 0)
            > ($s0->{samples}{dropped} // 0) + ($s0->{samples}{cancelled} // 0) },
        'the engine counts the samples not run');
    ok(($s1->{samples}{dropped} - $s0->{samples}{dropped}) + ($s1->{samples}{cancelled} - $s0->{samples}{cancelled})
       >= 10 - $k->{samples}, '  the engine dropped or cancelled the rest');
    my $m = $g->wait_metrics(sub { $g->metric($_[0], 'kvgate_sc_early_stops_total') >= 1 }, 'an early stop counted');
    ok($g->metric($m, 'kvgate_sc_early_stops_total') >= 1, '  kvgate_sc_early_stops_total');
    ok($g->metric($m, 'kvgate_sc_samples_asked_total') > $g->metric($m, 'kvgate_sc_samples_run_total'),
       '  samples asked > samples run');
    ok($g->engine_metric($m, 'kvgate_engine_samples_dropped_total')
       + $g->engine_metric($m, 'kvgate_engine_samples_cancelled_total') >= 10 - $k->{samples},
       '  kvgate_engine_samples_{dropped,cancelled}_total on the metrics page');
    ok($g->engine_metric($m, 'kvgate_engine_samples_started_total') >= 10, '  kvgate_engine_samples_started_total');
    my $st = $g->status;
    ok($st->{gateway}{self_consistency}{early_stops} >= 1, '  and the status page\'s gateway.self_consistency');

    # chat, streamed: later waves open with the role too, only drawn samples appear
    my ($code, $h, $ev) = $g->stream('/v1/chat/completions', {
        messages => [ { role => 'user', content => 'Tell me about Lily.' } ], max_tokens => 20,
        temperature => 0, n => 10, kvgate => { vote => 'majority', min_samples => 3, agreement => 0.6 } });
    is($code, 200, 'chat stream with waves: 200');
    my (%role, %seen);
    for my $e (grep { ref } @$ev) {
        for my $c (@{ $e->{choices} // [] }) {
            $seen{ $c->{index} } = 1;
            $role{ $c->{index} } = 1 if ($c->{delta}{role} // '') eq 'assistant';
        }
    }
    my ($vote) = grep { ref $_ && $_->{kvgate} } @$ev;
    my $n = $vote->{kvgate}{samples};
    ok($n && $n < 10, "  $n samples drawn");
    is_deeply([ sort { $a <=> $b } keys %seen ], [ 0 .. $n - 1 ], '  only they appear');
    is_deeply([ sort { $a <=> $b } keys %role ], [ 0 .. $n - 1 ], '  each opened with the role');
}

# ---- stopped_early means samples were saved ----------------------------------------------------

{
    # All 16 at once (no min_samples): a vote decided mid-way cancels the samples still
    # running, and a cancel may cross its sample's end, which then runs in full.
    # stopped_early (and the early-stops counter) must say a sample was cancelled or
    # never drawn, not merely that the decision came before the last one finished.
    my $m0 = $g->metrics;
    my $early = 0;
    for my $seed (1 .. 6) {
        my $r = $g->completion({ prompt => $story, max_tokens => 24, temperature => 0.7, n => 16, seed => $seed,
                                 kvgate => { vote => 'majority', answer_pattern => $names } });
        my $k = $r->{json}{kvgate} // {};
        my @cancelled = grep { $_->{finish_reason} eq 'cancelled' } @{ $r->{json}{choices} // [] };
        my $saved = @cancelled || ($k->{samples} // 0) < 16 ? 1 : 0;
        is($k->{stopped_early} ? 1 : 0, $saved, "seed $seed: stopped_early " . ($saved ? 'true' : 'false')
           . ' (' . scalar(@cancelled) . " cancelled, $k->{samples} drawn)");
        $early += $saved;
    }
    my $want = $g->metric($m0, 'kvgate_sc_early_stops_total') + $early;
    my $m1 = $g->wait_metrics(sub { $g->metric($_[0], 'kvgate_sc_requests_total')
                                    >= $g->metric($m0, 'kvgate_sc_requests_total') + 6 }, 'the six votes counted');
    is($g->metric($m1, 'kvgate_sc_early_stops_total'), $want, "  kvgate_sc_early_stops_total grew by $early");
}

# ---- the document is prefilled once ---------------------------------------------------------------

{
    # a document the cache has not seen (bypass or miss: either way computed here once)
    my $doc = join ' ', map { "Day $_: Ben and Mia played with a red ball in the big green park." } 1 .. 12;
    my $s0 = $g->status;
    my $r = $g->completion({ prompt => "$doc Who played?", max_tokens => 8, temperature => 1.0, seed => 7, n => 6,
                             kvgate => { vote => 'majority', answer_pattern => $names } });
    is($r->{status}, 200, 'a document, n=6: 200');
    my $pt = $r->{json}{usage}{prompt_tokens};
    ok($pt > 6 * 8, "  the document ($pt tokens) is longer than all answers together");
    my $s1 = $g->wait_status(sub { $_[0]{scheduler}{prefill_tokens} >= $s0->{scheduler}{prefill_tokens} + $pt - 16 },
                             'the prefill counted');
    my $d = $s1->{scheduler}{prefill_tokens} - $s0->{scheduler}{prefill_tokens};
    ok($d <= $pt + 6 * 8, "  the engine prefilled $d tokens: about document + n x answer, not n x document ("
       . 6 * $pt . ')');
}

# ---- bad input: a 400 naming the parameter, nothing reaches the engine ----------------------------------

{
    my $before = $g->status->{scheduler}{submitted};
    my @bad = (
        [ { kvgate => 'majority' }, 'kvgate' ],
        [ { kvgate => { vote => 'median' } }, 'kvgate.vote' ],
        [ { kvgate => { min_samples => 2 } }, 'kvgate.vote' ],
        [ { kvgate => { vote => 'majority', colour => 'red' } }, 'kvgate.colour' ],
        [ { n => 3, kvgate => { vote => 'majority', min_samples => 4 } }, 'kvgate.min_samples' ],
        [ { n => 3, kvgate => { vote => 'majority', min_samples => 0 } }, 'kvgate.min_samples' ],
        [ { kvgate => { vote => 'majority', agreement => 0 } }, 'kvgate.agreement' ],
        [ { kvgate => { vote => 'majority', agreement => 1.5 } }, 'kvgate.agreement' ],
        [ { kvgate => { vote => 'majority', wave => 0 } }, 'kvgate.wave' ],
        [ { kvgate => { vote => 'majority', answer_pattern => '(unclosed' } }, 'kvgate.answer_pattern', qr/pcre2?_compile|missing/i ],
        [ { kvgate => { vote => 'majority', answer_pattern => '\d+' } }, 'kvgate.answer_pattern', qr/exactly one capture/ ],
        [ { kvgate => { vote => 'majority', answer_pattern => '(\d+) (\w+)' } }, 'kvgate.answer_pattern', qr/it has 2/ ],
        [ { kvgate => { vote => 'majority', answer_pattern => '' } }, 'kvgate.answer_pattern' ],
        [ { n => 17, kvgate => { vote => 'majority' } }, 'n' ],
    );
    for my $b (@bad) {
        my ($extra, $param, $msg) = @$b;
        my $r = $g->completion({ prompt => $story, max_tokens => 4, n => 3, %$extra });
        my $what = JSON::PP->new->canonical->encode($extra);
        is($r->{status}, 400, "$what: 400");
        is($r->{json}{error}{param}, $param, "  param $param");
        is($r->{json}{error}{type}, 'invalid_request_error', '  invalid_request_error');
        like($r->{json}{error}{message}, $msg, '  the message says why') if $msg;
    }
    my $r = $g->chat({ messages => [ { role => 'user', content => 'Hi' } ],
                       kvgate => { vote => 'majority', answer_pattern => '(' } });
    is($r->{json}{error}{param}, 'kvgate.answer_pattern', 'chat: the same check');
    my $after = $g->wait_status(sub { 1 }, 'status')->{scheduler}{submitted};
    is($after, $before, 'the engine saw none of them');
}

$g->stop;
done_testing;
