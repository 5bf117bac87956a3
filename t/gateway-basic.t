#!/usr/bin/perl
# The gateway end to end with stories260K (real nginx, real engine): greedy
# completions equal the llama2.c reference; chat completions; streaming reassembles to
# the non-streaming text with the OpenAI chunk shapes; n=3 with a seed gives three
# reproducible choices; logprobs; /v1/models; the X-KVGate-* headers and every
# $kvgate_* variable in the access log.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Kvgate::Gateway;

my $g = Kvgate::Gateway->new;
my $golden = JSON::PP->new->decode(do {
    open my $fh, '<', Kvgate::Engine::shared_dir() . '/models/stories260K/golden-greedy.json' or die $!;
    local $/; <$fh>
});

# ---- /v1/models ---------------------------------------------------------------------

{
    my $r = $g->t->get('/v1/models');
    is($r->{status}, 200, 'GET /v1/models: 200');
    is($r->{json}{object}, 'list', '  a list');
    is($r->{json}{data}[0]{id}, 'stories260K', '  with the engine\'s model');
    is($r->{json}{data}[0]{max_model_len}, 512, '  and its context length');
    $r = $g->t->get('/v1/models/stories260K');
    is($r->{json}{id}, 'stories260K', 'GET /v1/models/stories260K: the model object');
    $r = $g->t->get('/v1/models/gpt-4');
    is($r->{status}, 404, 'GET /v1/models/gpt-4: 404');
    is($r->{json}{error}{code}, 'model_not_found', '  model_not_found');
}

# ---- greedy completions equal the reference ----------------------------------------------

for my $i (0 .. $#{ $golden->{cases} }) {
    my $c = $golden->{cases}[$i];
    my $n = scalar @{ $c->{greedy_ids} };
    my $want = substr($c->{full_text}, length $c->{prompt});
    my $r = $g->completion({ prompt => $c->{prompt}, max_tokens => $n, temperature => 0 });
    is($r->{status}, 200, "case $i: 200");
    is($r->{json}{choices}[0]{text}, $want, "case $i: the text is the reference continuation");
    is($r->{json}{usage}{prompt_tokens}, scalar @{ $c->{prompt_ids} }, "case $i: prompt_tokens");
    is($r->{json}{usage}{completion_tokens}, $n, "case $i: completion_tokens");
    if ($i == 0) {
        my $j = $r->{json};
        is($j->{object}, 'text_completion', 'object: text_completion');
        like($j->{id}, qr/^cmpl-[0-9a-f]{24}$/, 'id: cmpl-...');
        is($j->{model}, 'stories260K', 'model echoed');
        like($j->{system_fingerprint}, qr/^fp_[0-9a-f]{12}$/, 'system_fingerprint from the model identity');
        is($j->{choices}[0]{finish_reason}, 'length', 'finish_reason length');
        is($j->{usage}{total_tokens}, $j->{usage}{prompt_tokens} + $n, 'total_tokens');
        is($j->{usage}{prompt_tokens_details}{cached_tokens}, 0, 'prompt_tokens_details.cached_tokens');
        is($r->{headers}{'x-kvgate-cache'}, 'bypass', 'X-KVGate-Cache: bypass');
        is($r->{headers}{'x-kvgate-bucket'}, 'bypass', 'X-KVGate-Bucket: bypass');
        is($r->{headers}{'content-type'}, 'application/json', 'Content-Type: application/json');
    }
}

# The same reference through prompt token ids.
{
    my $c = $golden->{cases}[1];
    my $n = scalar @{ $c->{greedy_ids} };
    my $r = $g->completion({ prompt => $c->{prompt_ids}, max_tokens => $n, temperature => 0, logprobs => 0 });
    is($r->{json}{choices}[0]{text}, substr($c->{full_text}, length $c->{prompt}), 'prompt as token ids: same text');
    my $lp = $r->{json}{choices}[0]{logprobs};
    is(scalar @{ $lp->{token_logprobs} // [] }, $n, 'logprobs: 0 gives one logprob per token');
    ok(!grep({ $_ > 0 } @{ $lp->{token_logprobs} }), '  all <= 0');
    is(scalar @{ $lp->{tokens} }, $n, '  and the token strings');
    is(join('', @{ $lp->{tokens} }), $r->{json}{choices}[0]{text}, '  which spell the text');
}

# ---- chat -------------------------------------------------------------------------------

my $chat = { messages => [ { role => 'system', content => 'You tell stories.' },
                           { role => 'user', content => 'Once upon a time' } ],
             max_tokens => 24, temperature => 0 };
my $chat_text;
{
    my $r = $g->chat($chat);
    is($r->{status}, 200, 'chat: 200');
    my $j = $r->{json};
    is($j->{object}, 'chat.completion', 'object: chat.completion');
    like($j->{id}, qr/^chatcmpl-/, 'id: chatcmpl-...');
    is($j->{choices}[0]{message}{role}, 'assistant', 'message role assistant');
    $chat_text = $j->{choices}[0]{message}{content};
    ok(length $chat_text, "content: '$chat_text'");
    ok($j->{usage}{prompt_tokens} > 10, "the plain template's prompt: $j->{usage}{prompt_tokens} tokens");
    my $again = $g->chat($chat);
    is($again->{json}{choices}[0]{message}{content}, $chat_text, 'greedy chat is reproducible');
    $r = $g->chat({ %$chat, logprobs => JSON::PP::true });
    my $content = $r->{json}{choices}[0]{logprobs}{content};
    ok(@$content && exists $content->[0]{bytes} && exists $content->[0]{logprob}, 'chat logprobs: token, logprob, bytes');
}

# ---- streaming reassembles to the same text ---------------------------------------------------

{
    my $c = $golden->{cases}[0];
    my $want = substr($c->{full_text}, length $c->{prompt});
    my ($st, $h, $ev) = $g->stream('/v1/completions', { prompt => $c->{prompt}, temperature => 0,
                                                        max_tokens => scalar @{ $c->{greedy_ids} } });
    is($st, 200, 'stream: 200');
    like($h->{'content-type'}, qr{^text/event-stream}, '  Content-Type: text/event-stream');
    is($h->{'x-kvgate-cache'}, 'bypass', '  X-KVGate-Cache sent with the stream');
    is($ev->[-1], 'DONE', '  ends with data: [DONE]');
    ok(@$ev > 10, '  in many chunks (' . scalar(@$ev) . ')');
    my ($text) = $g->stream_texts($ev);
    is($text, $want, '  which reassemble to the reference text');
    my @fin = grep { ref $_ && $_->{choices}[0] && $_->{choices}[0]{finish_reason} } @$ev;
    is(scalar @fin, 1, '  one chunk carries the finish_reason');
    is($fin[0]{choices}[0]{finish_reason}, 'length', '  "length"');
    is($ev->[0]{object}, 'text_completion', '  chunks are text_completion objects');
    ok(!grep({ ref $_ && exists $_->{usage} } @$ev), '  no usage without stream_options.include_usage');

    ($st, $h, $ev) = $g->stream('/v1/chat/completions', { %$chat, stream_options => { include_usage => JSON::PP::true } });
    is($ev->[0]{object}, 'chat.completion.chunk', 'chat stream: chat.completion.chunk');
    is($ev->[0]{choices}[0]{delta}{role}, 'assistant', '  the first delta has the role');
    my ($ctext) = $g->stream_texts($ev);
    is($ctext, $chat_text, '  reassembles to the non-streamed content');
    my $usage = $ev->[-2];
    is_deeply($usage->{choices}, [], '  include_usage: a last chunk with no choices');
    is($usage->{usage}{completion_tokens}, 24, '  and the usage');
    ok(exists $ev->[1]{usage} && !defined $ev->[1]{usage}, '  other chunks have "usage": null');
}

# ---- n samples --------------------------------------------------------------------------------

{
    my $req = { prompt => 'Lily and Tom went to the park.', max_tokens => 30, temperature => 0.9, seed => 42, n => 3 };
    my $a = $g->completion($req);
    my $b = $g->completion($req);
    is(scalar @{ $a->{json}{choices} }, 3, 'n=3: three choices');
    is_deeply([ map { $_->{index} } @{ $a->{json}{choices} } ], [ 0, 1, 2 ], '  indexed 0, 1, 2');
    is_deeply([ map { $_->{text} } @{ $b->{json}{choices} } ], [ map { $_->{text} } @{ $a->{json}{choices} } ],
              '  the same seed gives the same three choices');
    my %distinct = map { $_->{text} => 1 } @{ $a->{json}{choices} };
    ok(keys %distinct > 1, '  that differ from each other');
    my ($st, $h, $ev) = $g->stream('/v1/completions', $req);
    is_deeply([ $g->stream_texts($ev) ], [ map { $_->{text} } @{ $a->{json}{choices} } ],
              '  streamed, each index reassembles to the same text');
    my $c = $g->completion({ %$req, seed => 43 });
    ok(join('|', map { $_->{text} } @{ $c->{json}{choices} }) ne join('|', map { $_->{text} } @{ $a->{json}{choices} }),
       '  another seed, other choices');
    is($a->{json}{usage}{completion_tokens}, 90, '  usage counts all three (3 x 30)');
}

# ---- stop strings ----------------------------------------------------------------------------

{
    my $c = $golden->{cases}[0];
    my $r = $g->completion({ prompt => $c->{prompt}, max_tokens => 100, temperature => 0, stop => ['Lily'] });
    is($r->{json}{choices}[0]{text}, ', there was a little girl named ', 'stop string: the text ends before it');
    is($r->{json}{choices}[0]{finish_reason}, 'stop', '  finish_reason stop');
}

# ---- variables -------------------------------------------------------------------------------

{
    my $r = $g->completion({ prompt => 'Once upon a time', max_tokens => 5, temperature => 0 }, 'X-Tenant-Id' => 'acme');
    # (the access log is written in the log phase, after the response: wait for the line)
    my $line = $g->wait_log(qr/t=acme/);
    like($line // '', qr/^200 t=acme b=bypass p=5 c=0 g=5 s=bypass ttft=\d+\.\d{6} key=[0-9a-f]{64}$/,
         'access log: every $kvgate_* variable') or diag($line);
    my $missing = $g->wait_log(qr/^404 /);
    like($missing // '', qr/^404 t=- b=- p=- c=- g=- s=- ttft=- key=-$/, '  unset ones are "-" for a request that never got that far');
}

$g->stop;
done_testing;
