#!/usr/bin/perl
# The other model families served end to end (issue 29): a tiny random-weight Qwen3 and
# Phi-3 (build/bench/synth_gguf --arch) carrying their real vocabularies and their own
# chat templates, behind the gateway. Each chat request renders the model's template
# (the prompt ids are those `kvgate-tokenize --chat` gives), the answer is the engine's
# greedy continuation of exactly those ids (kvgate-generate on the same file, outside
# the gateway), streamed or not, and a repeat is served from the prefix cache with the
# same answer. t/engine-families.t holds each family's forward pass to llama.cpp.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Temp qw(tempdir);
use JSON::PP;
use Test::More;
use Kvgate::Gateway;

my $shared = Kvgate::Engine::shared_dir();
my $build = Kvgate::Engine::build_dir();
my $dir = tempdir(CLEANUP => 1);
my $json = JSON::PP->new->canonical;

my @families = (
    { arch => 'qwen3', vocab => 'ggml-vocab-qwen2.gguf', template => 'Qwen-Qwen3-0.6B.jinja' },
    { arch => 'phi3', vocab => 'ggml-vocab-phi-3.gguf', template => 'microsoft-Phi-3.5-mini-instruct.jinja' },
);

sub slurp_cmd {
    my (@cmd) = @_;
    open my $fh, '-|', @cmd or die "@cmd: $!";
    local $/;
    my $s = <$fh>;
    close $fh;
    return ($? >> 8, $s // '');
}

for my $f (@families) {
    my $gguf = "$dir/$f->{arch}.gguf";
    my $out = `'$build/bench/synth_gguf' --arch $f->{arch} --shape tiny --dtype q8_0 --vocab '$shared/tokenizers/vectors/$f->{vocab}' --out '$gguf' --ctx 1024 --chat-template '$shared/templates/$f->{template}' 2>&1`;
    is($?, 0, "$f->{arch}: a tiny model with its vocabulary and $f->{template} is written") or diag($out);

    # A prompt past the 128 tokens under which requests bypass the cache.
    my $doc = join ' ', map { "Paragraph $_ of the handbook: the rainbow has seven colours, from red to violet." }
                        1 .. 12;
    my @conv = ({ role => 'system', content => "You answer from this handbook.\n$doc" },
                { role => 'user', content => 'Name three colours of the rainbow, please.' });
    my $mf = "$dir/m.json";
    open my $fh, '>', $mf or die $!;
    print $fh $json->encode(\@conv);
    close $fh;
    my ($rc, $ids) = slurp_cmd(Kvgate::Engine::bin('kvgate-tokenize'), '--chat', $mf, '--tokenizer', $gguf,
                               '--add-generation-prompt');
    is($rc, 0, "$f->{arch}: kvgate-tokenize --chat renders the template");
    my @ids = split ' ', $ids;
    cmp_ok(scalar @ids, '>=', 128, "$f->{arch}: the prompt is long enough to be cached");
    ($rc, my $want) = slurp_cmd(Kvgate::Engine::bin('kvgate-generate'), '--model', $gguf, '--prompt-ids',
                                join(',', @ids), '--temperature', '0', '--max-tokens', '8');
    is($rc, 0, "$f->{arch}: kvgate-generate continues those ids");
    $want =~ s/\n\z//;          # the line kvgate-generate ends its output with

    my $g = Kvgate::Gateway->new(engine_args => [ '--model', $gguf, '--served-model-name', $f->{arch} ]);
    like($g->engine->ready_line, qr/chat template the model's own/, "$f->{arch}: served with the model's template");
    for my $round (1, 2) {
        for my $stream (0, 1) {
            my $body = { model => $f->{arch}, messages => \@conv, temperature => 0, max_tokens => 8 };
            my ($text, $usage);
            if ($stream) {
                my ($st, undef, $evs) = $g->stream('/v1/chat/completions',
                    { %$body, stream_options => { include_usage => JSON::PP::true } });
                is($st, 200, "$f->{arch} round $round streamed: 200");
                my @ev = grep { ref $_ } @$evs;
                $text = join '', map { $_->{choices}[0]{delta}{content} // '' } grep { @{ $_->{choices} // [] } } @ev;
                ($usage) = map { $_->{usage} } grep { $_->{usage} } @ev;
            } else {
                my $r = $g->post('/v1/chat/completions', $body);
                is($r->{status}, 200, "$f->{arch} round $round: 200") or diag(explain($r->{json}));
                $text = $r->{json}{choices}[0]{message}{content};
                $usage = $r->{json}{usage};
            }
            my $what = "$f->{arch} round $round" . ($stream ? ' streamed' : '');
            is($usage->{prompt_tokens}, scalar @ids, "$what: the prompt is the template's (" . scalar(@ids) . ' ids)');
            is($text, $want, "$what: the answer is kvgate-generate's greedy continuation of those ids");
            if ($round == 2 || $stream) {
                cmp_ok($usage->{prompt_tokens_details}{cached_tokens}, '>', 0, "$what: the prefix came from the cache");
            }
            my $c = $g->post('/v1/completions', { model => $f->{arch}, prompt => [ map { 0 + $_ } @ids ],
                                                  temperature => 0, max_tokens => 8 });
            is($c->{json}{choices}[0]{text}, $text, "$what: the same text as /v1/completions on those ids");
        }
    }
    $g->stop;
}

done_testing;
