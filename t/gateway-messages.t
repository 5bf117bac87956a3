#!/usr/bin/perl
# Anthropic's Messages API (POST /v1/messages) through the gateway: the message
# object, rendered by the model's chat template exactly as the same conversation on
# /v1/chat/completions (a string system prompt, text blocks, the turns); the stream's
# event sequence with the same text; usage as Anthropic reports it (input_tokens not
# cached, cache_read_input_tokens the cached prefix of a repeated >= 128-token prompt,
# cache_creation_input_tokens 0); stop_sequences and stop_reason; cache_control
# blocks accepted (at most 4, ttl 5m/1h); the tenant from the header only; every
# refusal as Anthropic's error object with its status.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Kvgate::Engine;
use Kvgate::Gateway;

my $g = Kvgate::Gateway->new(locations => <<'EOF');
        location /strict/v1/ {
            kvgate_pass;
            kvgate_tenant_required on;
        }
EOF

my $M = 'stories260K';
my $story = [ { role => 'user', content => 'Tell me a story' } ];

sub messages {
    my ($body, %h) = @_;
    return $g->post('/v1/messages', { model => $M, %$body }, %h);
}

sub text_of { return join '', map { $_->{text} } @{ $_[0]{json}{content} // [] } }

# The events of an Anthropic stream: [name, data] pairs, every block checked to be
# "event: NAME\ndata: JSON" with data.type == NAME.
sub anthropic_stream {
    my ($path, $body, %h) = @_;
    my $s = $g->send_raw($path, { model => $M, stream => JSON::PP::true, %$body }, %h);
    my ($status, $hd, $b) = $g->parse_http($g->read_all($s));
    close $s;
    my (@ev, $bad);
    for my $block (split /\n\n/, $b) {
        if ($block !~ /\Aevent: (\w+)\ndata: (.*)\z/s) {
            $bad //= $block;
            next;
        }
        my ($name, $data) = ($1, eval { JSON::PP->new->decode($2) });
        $bad //= $block unless $data && ($data->{type} // '') eq $name;
        push @ev, [ $name, $data // {} ];
    }
    return ($status, $hd, \@ev, $bad);
}

# ---- non-streaming --------------------------------------------------------------------------

my $r = messages({ max_tokens => 24, temperature => 0, messages => $story }, 'X-Tenant-Id' => 'm');
is($r->{status}, 200, 'POST /v1/messages: 200');
my $j = $r->{json} // {};
like($j->{id} // '', qr/^msg_[0-9a-f]{24}$/, '  id msg_...');
is($j->{type}, 'message', '  type message');
is($j->{role}, 'assistant', '  role assistant');
is($j->{model}, $M, '  model');
is(scalar @{ $j->{content} // [] }, 1, '  one content block');
is($j->{content}[0]{type}, 'text', '  of type text');
ok(length(text_of($r)), "  text '" . text_of($r) . "'");
is($j->{stop_reason}, 'max_tokens', '  stop_reason max_tokens (24 tokens)');
ok(exists $j->{stop_sequence} && !defined $j->{stop_sequence}, '  stop_sequence null');
is_deeply([ sort keys %{ $j->{usage} // {} } ],
          [ qw(cache_creation_input_tokens cache_read_input_tokens input_tokens output_tokens) ],
          '  usage has the four fields');
is($j->{usage}{output_tokens}, 24, '  output_tokens 24');
is($j->{usage}{cache_creation_input_tokens}, 0, '  cache_creation_input_tokens 0');
is($j->{usage}{cache_read_input_tokens}, 0, '  a short prompt: nothing read from the cache');

my $c = $g->chat({ max_tokens => 24, temperature => 0, messages => $story }, 'X-Tenant-Id' => 'm');
is(text_of($r), $c->{json}{choices}[0]{message}{content},
   'the same text as /v1/chat/completions for the same conversation (temperature 0)');
is($j->{usage}{input_tokens}, $c->{json}{usage}{prompt_tokens}, '  input_tokens = its prompt_tokens');

# system (a string, or text blocks) and content blocks: the template gets what chat gets
{
    my @turns = ({ role => 'user', content => 'Tell me a story' },
                 { role => 'assistant', content => 'Once upon a time' },
                 { role => 'user', content => [ { type => 'text', text => 'Go on.' },
                                                { type => 'text', text => 'About Lily.' } ] });
    my $ref = $g->chat({ max_tokens => 16, temperature => 0,
                         messages => [ { role => 'system', content => 'You tell stories.' }, @turns ] },
                       'X-Tenant-Id' => 'm');
    my $want = $ref->{json}{choices}[0]{message}{content};
    my $a = messages({ max_tokens => 16, temperature => 0, system => 'You tell stories.',
                       messages => \@turns }, 'X-Tenant-Id' => 'm');
    is($a->{status}, 200, 'system as a string, three turns, text blocks: 200');
    is(text_of($a), $want, '  the same text as chat with a system message and text parts');
    is($a->{json}{usage}{input_tokens} + $a->{json}{usage}{cache_read_input_tokens},
       $ref->{json}{usage}{prompt_tokens}, '  the same prompt length');
    my $b = messages({ max_tokens => 16, temperature => 0,
                       system => [ { type => 'text', text => 'You tell' },
                                   { type => 'text', text => 'stories.',
                                     cache_control => { type => 'ephemeral' } } ],
                       messages => \@turns }, 'X-Tenant-Id' => 'm');
    my $ref2 = $g->chat({ max_tokens => 16, temperature => 0,
                          messages => [ { role => 'system',
                                          content => [ { type => 'text', text => 'You tell' },
                                                       { type => 'text', text => 'stories.' } ] },
                                        @turns ] }, 'X-Tenant-Id' => 'm');
    is($b->{status}, 200, 'system as text blocks with a cache_control: 200');
    is(text_of($b), $ref2->{json}{choices}[0]{message}{content}, '  the same text as chat with system parts');
}

# ---- streaming ------------------------------------------------------------------------------

{
    my ($st, $h, $ev, $bad) = anthropic_stream('/v1/messages',
        { max_tokens => 24, temperature => 0, messages => $story }, 'X-Tenant-Id' => 'm');
    is($st, 200, 'stream: 200');
    like($h->{'content-type'} // '', qr{^text/event-stream}, '  text/event-stream');
    ok(!defined $bad, '  every event is "event: NAME\ndata: JSON" with type NAME') or diag($bad);
    my @names = map { $_->[0] } @$ev;
    my $seq = join ' ', @names;
    $seq =~ s/(?: content_block_delta)+/ content_block_delta*/;
    is($seq, 'message_start content_block_start ping content_block_delta* content_block_stop '
             . 'message_delta message_stop', '  the event sequence');
    my $start = $ev->[0][1]{message} // {};
    like($start->{id} // '', qr/^msg_/, '  message_start: the message id');
    is_deeply($start->{content}, [], '  empty content');
    is($start->{role}, 'assistant', '  role assistant');
    is($start->{usage}{input_tokens}, $j->{usage}{input_tokens}, '  usage.input_tokens');
    is($start->{usage}{output_tokens}, 0, '  usage.output_tokens 0');
    is_deeply($ev->[1][1]{content_block}, { type => 'text', text => '' }, '  content_block_start: an empty text block');
    my $text = join '', map { $_->[1]{delta}{text} }
                        grep { $_->[0] eq 'content_block_delta' && $_->[1]{delta}{type} eq 'text_delta' } @$ev;
    is($text, text_of($r), '  the text_deltas add up to the non-streamed text');
    my ($md) = map { $_->[1] } grep { $_->[0] eq 'message_delta' } @$ev;
    is($md->{delta}{stop_reason}, 'max_tokens', '  message_delta: stop_reason max_tokens');
    ok(exists $md->{delta}{stop_sequence} && !defined $md->{delta}{stop_sequence}, '  stop_sequence null');
    is($md->{usage}{output_tokens}, 24, '  usage.output_tokens 24');
}

# ---- stop_sequences ---------------------------------------------------------------------------

{
    my $full = text_of($r);
    my ($word) = $full =~ /^\s*\S+\s+(\S{2,})/;
    $word //= substr($full, 3, 2);
    my $at = index($full, $word);
    my $s = messages({ max_tokens => 24, temperature => 0, messages => $story,
                       stop_sequences => [ 'zzqq', $word ] }, 'X-Tenant-Id' => 'm');
    is($s->{status}, 200, "stop_sequences ['zzqq', '$word']: 200");
    is(text_of($s), substr($full, 0, $at), '  the text up to the stop sequence');
    is($s->{json}{stop_reason}, 'stop_sequence', '  stop_reason stop_sequence');
    is($s->{json}{stop_sequence}, $word, '  stop_sequence: the one that matched');
    my ($st, undef, $ev) = anthropic_stream('/v1/messages',
        { max_tokens => 24, temperature => 0, messages => $story, stop_sequences => [ $word ] },
        'X-Tenant-Id' => 'm');
    my ($md) = map { $_->[1] } grep { $_->[0] eq 'message_delta' } @$ev;
    is($md->{delta}{stop_reason}, 'stop_sequence', '  streamed: message_delta stop_reason stop_sequence');
    is($md->{delta}{stop_sequence}, $word, '  and the stop sequence');
    my $n = messages({ max_tokens => 24, temperature => 0, messages => $story,
                       stop_sequences => [ 'zzqq' ] }, 'X-Tenant-Id' => 'm');
    is($n->{json}{stop_reason}, 'max_tokens', 'a stop sequence that never comes: max_tokens');
    ok(!defined $n->{json}{stop_sequence}, '  stop_sequence null');
}

# ---- usage with the prefix cache ------------------------------------------------------------

my $doc = join ' ', map { $_->{full_text} } @{ JSON::PP->new->decode(do {
    open my $fh, '<', Kvgate::Engine::shared_dir() . '/models/stories260K/golden-greedy.json' or die $!;
    local $/; <$fh>
})->{cases} }[0 .. 1];
$doc = substr($doc, 0, 900);

{
    my $body = { max_tokens => 8, temperature => 0, system => "You tell stories. $doc",
                 messages => [ { role => 'user', content => 'Who is in the story?' } ] };
    my $first = messages($body, 'X-Tenant-Id' => 'cache');
    my $u1 = $first->{json}{usage} // {};
    my $pt = ($u1->{input_tokens} // 0) + ($u1->{cache_read_input_tokens} // 0);
    ok($pt >= 128, "a $pt-token prompt");
    is($u1->{cache_read_input_tokens}, 0, '  first: cache_read_input_tokens 0');
    is($u1->{input_tokens}, $pt, '  input_tokens: the whole prompt');
    is($first->{headers}{'x-kvgate-cache'}, 'miss', '  X-KVGate-Cache: miss');
    my $second = messages($body, 'X-Tenant-Id' => 'cache');
    my $u2 = $second->{json}{usage} // {};
    my $cached = int(($pt - 1) / 16) * 16;
    is($u2->{cache_read_input_tokens}, $cached,
       "  again: cache_read_input_tokens $cached (every full block before the last token)");
    is($u2->{input_tokens}, $pt - $cached, '  input_tokens: the rest');
    is($u2->{cache_creation_input_tokens}, 0, '  cache_creation_input_tokens 0');
    is(text_of($second), text_of($first), '  the same answer, cached or not');
    is($second->{headers}{'x-kvgate-cache'}, 'hit', '  X-KVGate-Cache: hit');
    my $oai = $g->chat({ max_tokens => 8, temperature => 0,
                         messages => [ { role => 'system', content => $body->{system} },
                                       @{ $body->{messages} } ] }, 'X-Tenant-Id' => 'cache');
    is($oai->{json}{usage}{prompt_tokens_details}{cached_tokens}, $u2->{cache_read_input_tokens},
       '  chat completions reads the same prefix: cached_tokens = cache_read_input_tokens');

    # the tenant comes from the header, never from the body
    my $other = messages({ %$body, tenant => 'cache', metadata => { user_id => 'cache' } },
                         'X-Tenant-Id' => 'someone-else');
    is($other->{status}, 200, 'metadata.user_id accepted');
    is($other->{json}{usage}{cache_read_input_tokens}, 0,
       '  another tenant (header) with "tenant"/metadata naming the first in the body: nothing cached');
    my ($st, undef, $ev) = anthropic_stream('/v1/messages', $body, 'X-Tenant-Id' => 'cache');
    my $start = $ev->[0][1]{message}{usage} // {};
    is($start->{cache_read_input_tokens}, $cached, 'streamed: message_start usage.cache_read_input_tokens');
    is($start->{input_tokens}, $pt - $cached, '  usage.input_tokens');
    my ($md) = map { $_->[1] } grep { $_->[0] eq 'message_delta' } @$ev;
    is($md->{usage}{cache_read_input_tokens}, $cached, '  message_delta usage.cache_read_input_tokens');
}

# ---- cache_control: accepted, at most 4 -------------------------------------------------------

{
    my $cc = sub { { type => 'text', text => $_[0], cache_control => { type => 'ephemeral', @_[1 .. $#_] } } };
    my $ok = messages({ max_tokens => 4,
                        system => [ $cc->('You tell stories.', ttl => '1h') ],
                        messages => [ { role => 'user', content => [ $cc->('Once', ttl => '1h'), $cc->('upon', ttl => '5m') ] },
                                      { role => 'assistant', content => 'a time' },
                                      { role => 'user', content => [ $cc->('Go on.') ] } ] }, 'X-Tenant-Id' => 'm');
    is($ok->{status}, 200, '4 cache_control breakpoints (ttl 1h, 5m, none): 200');
}

# ---- errors ---------------------------------------------------------------------------------

sub anth_err {
    my ($res, $status, $type, $name, $msg_re) = @_;
    is($res->{status}, $status, "$name: $status");
    my $j = $res->{json} // {};
    is($j->{type}, 'error', '  type error');
    is($j->{error}{type}, $type, "  error.type $type");
    like($j->{error}{message} // '', $msg_re, '  message') if $msg_re;
    is_deeply([ sort keys %{ $j->{error} // {} } ], [ qw(message type) ], '  Anthropic\'s shape');
}

my $cc = { type => 'ephemeral' };
my $blk = sub { { type => 'text', text => $_[0], cache_control => $cc } };
anth_err(messages({ messages => $story }), 400, 'invalid_request_error', 'no max_tokens',
         qr/max_tokens/);
anth_err(messages({ max_tokens => 0, messages => $story }), 400, 'invalid_request_error',
         'max_tokens 0', qr/max_tokens/);
anth_err(messages({ max_tokens => 4 }), 400, 'invalid_request_error', 'no messages', qr/messages/);
anth_err(messages({ max_tokens => 4, messages => [] }), 400, 'invalid_request_error', 'messages []',
         qr/messages/);
anth_err(messages({ max_tokens => 4, messages => [ { role => 'system', content => 'x' } ] }), 400,
         'invalid_request_error', 'role system in messages', qr/messages\.0\.role.*top-level `system`/);
anth_err(messages({ max_tokens => 4, messages => [ { role => 'tool', content => 'x' } ] }), 400,
         'invalid_request_error', 'role tool', qr/messages\.0\.role: Input should be 'user' or 'assistant'/);
anth_err(messages({ max_tokens => 4, messages => [ { role => 'user' } ] }), 400,
         'invalid_request_error', 'no content', qr/messages\.0\.content/);
anth_err(messages({ max_tokens => 4, messages => [ { role => 'user', content => [
             { type => 'text', text => 'What is this?' },
             { type => 'image', source => { type => 'base64', media_type => 'image/png', data => 'AAAA' } } ] } ] }),
         400, 'invalid_request_error', 'an image block',
         qr/messages\.0\.content\.1\.type: content blocks of type 'image' are not supported/);
anth_err(messages({ max_tokens => 4, messages => [ { role => 'user', content => [ { type => 'text' } ] } ] }),
         400, 'invalid_request_error', 'a text block without text', qr/messages\.0\.content\.0\.text/);
anth_err(messages({ max_tokens => 4, system => [ { type => 'document', source => {} } ], messages => $story }),
         400, 'invalid_request_error', 'a document block in system', qr/system\.0\.type.*not supported/);
anth_err(messages({ max_tokens => 4, system => 7, messages => $story }), 400, 'invalid_request_error',
         'system 7', qr/system/);
anth_err(messages({ max_tokens => 4, messages => [ @$story, { role => 'assistant', content => 'Once' } ] }),
         400, 'invalid_request_error', 'an assistant prefill', qr/not supported/);
anth_err(messages({ max_tokens => 4, system => [ $blk->('a'), $blk->('b') ],
                    messages => [ { role => 'user', content => [ $blk->('c'), $blk->('d'), $blk->('e') ] } ] }),
         400, 'invalid_request_error', '5 cache_control blocks',
         qr/A maximum of 4 blocks with cache_control may be provided\. Found 5\./);
anth_err(messages({ max_tokens => 4, messages => [ { role => 'user', content => [
             { type => 'text', text => 'x', cache_control => { type => 'ephemeral', ttl => '2h' } } ] } ] }),
         400, 'invalid_request_error', 'ttl 2h', qr/messages\.0\.content\.0\.cache_control\.ttl: Input should be '5m' or '1h'/);
anth_err(messages({ max_tokens => 4, messages => [ { role => 'user', content => [
             { type => 'text', text => 'x', cache_control => { type => 'persistent' } } ] } ] }),
         400, 'invalid_request_error', 'cache_control type persistent', qr/cache_control\.type: Input should be 'ephemeral'/);
anth_err(messages({ max_tokens => 4, messages => [ { role => 'user', content => [
             { type => 'text', text => 'x', cache_control => { ttl => '5m' } } ] } ] }),
         400, 'invalid_request_error', 'cache_control without type', qr/cache_control\.type/);
anth_err(messages({ max_tokens => 4, temperature => 1.5, messages => $story }), 400, 'invalid_request_error',
         'temperature 1.5', qr/temperature/);
anth_err(messages({ max_tokens => 4, top_k => 0, messages => $story }), 400, 'invalid_request_error',
         'top_k 0', qr/top_k/);
anth_err(messages({ max_tokens => 4, stop_sequences => 'x', messages => $story }), 400, 'invalid_request_error',
         'stop_sequences a string', qr/stop_sequences/);
anth_err(messages({ max_tokens => 4, stop_sequences => [ '' ], messages => $story }), 400, 'invalid_request_error',
         'an empty stop sequence', qr/stop_sequences\.0/);
anth_err(messages({ max_tokens => 4, stop_sequences => [ 'a' .. 'e' ], messages => $story }), 400,
         'invalid_request_error', '5 stop sequences', qr/at most 4/);
anth_err(messages({ max_tokens => 4, metadata => 'x', messages => $story }), 400, 'invalid_request_error',
         'metadata a string', qr/metadata/);
anth_err(messages({ max_tokens => 4, messages => $story,
                    tools => [ { name => 'f', input_schema => { type => 'object' } } ] }),
         400, 'invalid_request_error', 'tools', qr/tools: tools are not supported/);
anth_err(messages({ max_tokens => 4, messages => $story, stream => 'yes' }), 400, 'invalid_request_error',
         'stream "yes"', qr/stream/);
anth_err($g->post('/v1/messages', '{"model": "stories260K", "max_tokens": '), 400, 'invalid_request_error',
         'invalid JSON', qr/JSON/);
anth_err(messages({ max_tokens => 4, model => 'claude-sonnet-4-5', messages => $story }), 404, 'not_found_error',
         'an unknown model', qr/claude-sonnet-4-5/);
anth_err(messages({ max_tokens => 100000, messages => $story }), 400, 'invalid_request_error',
         'max_tokens over the context', qr/context length/);
anth_err($g->post('/strict/v1/messages', { model => $M, max_tokens => 4, messages => $story }), 401,
         'authentication_error', 'kvgate_tenant_required without the header', qr/tenant/i);
anth_err($g->t->get('/v1/messages'), 405, 'invalid_request_error', 'GET /v1/messages', qr/POST/);
{
    my $s = $g->send_raw('/v1/messages', { model => $M, stream => JSON::PP::true, max_tokens => 4 });
    my ($st, $h, $b) = $g->parse_http($g->read_all($s));
    close $s;
    is($st, 400, 'a stream refused before it starts: a plain 400');
    like($h->{'content-type'} // '', qr{^application/json}, '  application/json');
    my $e = eval { JSON::PP->new->decode($b) } // {};
    ok($e->{type} eq 'error' && $e->{error}{type} eq 'invalid_request_error', '  Anthropic\'s error object');
}

# ---- the endpoint's own label in kvgate_requests_total -------------------------------------

{
    my $sum = sub {
        my ($text, $status) = @_;
        my $n = 0;
        $n += $1 while $text =~ /^kvgate_requests_total\{endpoint="messages",[^}]*status="$status"\} (\d+)$/mg;
        return $n;
    };
    my $m = $g->wait_metrics(sub { $sum->($_[0], 200) >= 10 && $sum->($_[0], 404) >= 1 },
                             'the /v1/messages requests counted');
    ok($sum->($m, 200) >= 10, 'kvgate_requests_total{endpoint="messages",...,status="200"}');
    ok($sum->($m, 404) >= 1, '  and status="404"');
}

$g->stop;
done_testing;
