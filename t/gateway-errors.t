#!/usr/bin/perl
# Every refusal of the gateway as an OpenAI error object with the right status and
# param: invalid JSON and parameters (400), a missing tenant (401), an unknown model or
# path (404), a wrong method (405), a body over client_max_body_size, declared or
# chunked (413), a saturated engine (429 + Retry-After), a deadline (504, and an error
# event in a stream); bodies spilled to temp files still work; nginx's own refusals
# before a location is chosen (a malformed request, Content-Length with
# Transfer-Encoding, %00 in the URI, headers or request line too large) in a server
# with a kvgate_pass location, unless the server has its own error_page.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use POSIX qw(WNOHANG);
use Test::More;
use Time::HiRes qw(sleep time);
use Kvgate::Gateway;

# A second server without kvgate (nginx's own pages stay), a third with its own
# error_page 400 (it wins).
my $g = Kvgate::Gateway->new(http => <<'EOF0', locations => <<'EOF');
    server {
        listen 127.0.0.1:%%PORT_1%%;
        location / { return 204; }
    }
    server {
        listen 127.0.0.1:%%PORT_2%%;
        error_page 400 /own400;
        location = /own400 { return 200 "own page"; }
        location /v1/ { kvgate_pass; }
    }
EOF0
        location /strict/v1/ {
            kvgate_pass;
            kvgate_tenant_required on;
            kvgate_max_n 4;
            kvgate_max_tokens 50;
        }
        location /small/v1/ {
            kvgate_pass;
            client_max_body_size 2k;
        }
        location /spill/v1/ {
            kvgate_pass;
            client_body_buffer_size 512;
            client_body_in_file_only clean;
        }
        location /hurry/v1/ {
            kvgate_pass;
            kvgate_timeout 50ms;
        }
EOF

sub err_is {
    my ($r, $status, $code, $param, $name, $msg_re) = @_;
    is($r->{status}, $status, "$name: $status");
    my $e = $r->{json}{error} // {};
    is($e->{code}, $code, "  code " . ($code // 'null'));
    is($e->{param}, $param, "  param " . ($param // 'null')) if @_ > 4;
    like($e->{message} // '', $msg_re, "  message: " . ($e->{message} // '')) if $msg_re;
    ok(defined $e->{type} && length $e->{type}, "  type $e->{type}") if $e->{type} || $status;
    like($r->{headers}{'content-type'} // '', qr{^application/json}, '  as JSON');
}

my $ok = { model => 'stories260K', prompt => 'Once upon a time', max_tokens => 4 };

# ---- 400 -----------------------------------------------------------------------------------

err_is($g->post('/v1/completions', '{"model": "stories260K", "prompt": '), 400, 'invalid_json', undef,
       'truncated JSON', qr/could not parse the JSON body/);
err_is($g->post('/v1/completions', { %$ok, temperature => 'hot' }), 400, 'invalid_type', 'temperature',
       'temperature as a string');
err_is($g->post('/v1/completions', { prompt => 'x' }), 400, 'missing_required_parameter', 'model', 'no model');
err_is($g->post('/v1/chat/completions', { model => 'stories260K', messages => [] }), 400, 'empty_array',
       'messages', 'no messages');
err_is($g->post('/v1/chat/completions', { model => 'stories260K', messages => [ { role => 'wizard', content => 'x' } ] }),
       400, undef, undef, 'an unknown role') if 0;
err_is($g->post('/v1/completions', { %$ok, presence_penalty => 0.5 }), 400, 'unsupported_parameter',
       'presence_penalty', 'presence_penalty');
err_is($g->post('/v1/completions', { %$ok, logprobs => 5 }), 400, 'unsupported_parameter', 'logprobs',
       'logprobs with alternatives');
err_is($g->post('/v1/completions', "{\"model\":\"stories260K\",\"prompt\":\"\xff\xfe\"}"), 400, 'invalid_encoding', undef,
       'a body that is not UTF-8');
err_is($g->post('/v1/completions', { %$ok, prompt => 'word ' x 600 }), 400, 'context_length_exceeded', 'prompt',
       'a prompt longer than the context', qr/maximum context length is 512 tokens/);
err_is($g->post('/v1/completions', { %$ok, max_tokens => 600 }), 400, 'context_length_exceeded', 'max_tokens',
       'prompt + max_tokens over the context', qr/you requested 605 tokens \(5 in the prompt, 600 in the completion\)/);
err_is($g->post('/v1/completions', { %$ok, prompt => [ 1, 403, 9999 ] }), 400, 'invalid_value', 'prompt',
       'a token id outside the vocabulary');
err_is($g->post('/strict/v1/completions', { %$ok, n => 5 }, 'X-Tenant-Id' => 't'), 400, 'integer_above_max_value', 'n',
       'n above kvgate_max_n 4', qr/greater than the maximum of 4/);
err_is($g->post('/strict/v1/completions', { %$ok, max_tokens => 51 }, 'X-Tenant-Id' => 't'), 400,
       'integer_above_max_value', 'max_tokens', 'max_tokens above kvgate_max_tokens 50');
err_is($g->post('/v1/completions', { %$ok, n => 17 }), 400, 'integer_above_max_value', 'n',
       'n above the engine\'s 16');

# ---- 401, 404, 405 ----------------------------------------------------------------------------

err_is($g->post('/strict/v1/completions', $ok), 401, 'missing_tenant', undef,
       'kvgate_tenant_required on, no X-Tenant-Id', qr/requires a tenant/);
# the tenant comes first, whatever the body holds
err_is($g->post('/strict/v1/completions', '{"model": "stories260K", "prompt": '), 401, 'missing_tenant', undef,
       '  and truncated JSON', qr/requires a tenant/);
err_is($g->post('/strict/v1/completions', { %$ok, model => 'gpt-4o' }), 401, 'missing_tenant', undef,
       '  and an unknown model', qr/requires a tenant/);
is($g->post('/strict/v1/completions', $ok, 'X-Tenant-Id' => 'acme')->{status}, 200, '  with the header: 200');
{
    my $r = $g->post('/strict/v1/completions', { %$ok, max_tokens => undef }, 'X-Tenant-Id' => 'acme');
    is($r->{json}{usage}{completion_tokens} <= 50 ? 1 : 0, 1, '  no max_tokens: capped at kvgate_max_tokens');
}
err_is($g->post('/v1/completions', { %$ok, model => 'gpt-4o' }), 404, 'model_not_found', 'model', 'an unknown model',
       qr/The model `gpt-4o` does not exist/);
err_is($g->post('/v1/embeddings', { model => 'stories260K', input => 'x' }), 404, undef, undef, 'an unknown path',
       qr{Invalid URL \(POST /v1/embeddings\)});
{
    my $r = $g->t->get('/v1/chat/completions');
    err_is($r, 405, 'method_not_allowed', undef, 'GET /v1/chat/completions');
    is($r->{headers}{allow}, 'POST', '  Allow: POST');
    $r = $g->post('/v1/models', {});
    is($r->{status}, 405, 'POST /v1/models: 405');
}

# ---- 413 --------------------------------------------------------------------------------------

err_is($g->post('/small/v1/completions', { %$ok, prompt => 'x' x 3000 }), 413, 'request_too_large', undef,
       'a 3 KB body over client_max_body_size 2k', qr/client_max_body_size 2048 bytes/);
{
    my $body = JSON::PP->new->encode({ %$ok, prompt => 'y' x 3000 });
    my $raw = "POST /small/v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            . "Content-Type: application/json\r\nConnection: close\r\n\r\n";
    for (my $i = 0; $i < length $body; $i += 500) {
        my $part = substr($body, $i, 500);
        $raw .= sprintf("%x\r\n%s\r\n", length $part, $part);
    }
    $raw .= "0\r\n\r\n";
    my ($resp) = Kvgate::Test->parse_responses($g->t->raw($raw));
    is($resp->{status}, 413, 'a chunked body over the limit: 413');
    like($resp->{body}, qr/"code":"request_too_large"/, '  as an OpenAI error');
}

# ---- bodies in temp files -----------------------------------------------------------------

{
    my $prompt = join ' ', ('Lily had a red ball and a little dog.') x 60;
    my $r = $g->post('/spill/v1/completions', { %$ok, prompt => substr($prompt, 0, 1200) });
    is($r->{status}, 200, 'a body in a temp file (client_body_in_file_only): 200') or diag($r->{body});
    ok($r->{json}{usage}{prompt_tokens} > 128, "  all of it read ($r->{json}{usage}{prompt_tokens} prompt tokens)");
    my $direct = $g->post('/v1/completions', { %$ok, prompt => substr($prompt, 0, 1200) });
    is($r->{json}{usage}{prompt_tokens}, $direct->{json}{usage}{prompt_tokens}, '  the same tokens as from memory');
}

# ---- nginx's own refusals, before a location is chosen ----------------------------------------

{
    my @raw = (
        [ 'Content-Length with Transfer-Encoding',
          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
          400, qr/malformed/ ],
        [ 'two Content-Length headers',
          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
          400, qr/malformed/ ],
        [ '%00 in the URI', "GET /v1/mo%00dels HTTP/1.1\r\nHost: x\r\n\r\n", 400, qr/malformed/ ],
        [ 'two Host headers', "GET /v1/models HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400, qr/malformed/ ],
        [ 'a request line that is no HTTP', "BAD\r\n\r\n", 400, qr/malformed/ ],
        [ 'a header line over 8k', "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " . ('a' x 9000) . "\r\n\r\n",
          400, qr/headers are too large/ ],
        [ 'a request line over 8k', 'GET /' . ('a' x 9000) . " HTTP/1.1\r\nHost: x\r\n\r\n", 414,
          qr/request line is too long/ ],
    );
    for my $c (@raw) {
        my ($name, $bytes, $status, $msg) = @$c;
        my ($resp) = Kvgate::Test->parse_responses($g->t->raw($bytes));
        $resp //= {};
        is($resp->{status}, $status, "$name: $status");
        like($resp->{headers}{'content-type'} // '', qr{^application/json}, '  as JSON');
        my $j = eval { JSON::PP->new->decode($resp->{body}) } // {};
        is($j->{error}{type}, 'invalid_request_error', '  an OpenAI error');
        like($j->{error}{message} // '', $msg, "  message: " . ($j->{error}{message} // ''));
    }
    my $bad = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello";
    my ($other) = Kvgate::Test->parse_responses($g->t->raw($bad, port => $g->t->port(1)));
    like($other->{headers}{'content-type'} // '', qr{^text/html}, 'a server without kvgate: nginx\'s own page');
    my ($own) = Kvgate::Test->parse_responses($g->t->raw($bad, port => $g->t->port(2)));
    is($own->{body}, 'own page', "a server with its own error_page 400: that one");
}

# ---- 504 ----------------------------------------------------------------------------------

{
    my $long = { %$ok, n => 16, max_tokens => 480, temperature => 1.0 };
    my $t0 = time;
    my $r = $g->post('/hurry/v1/completions', $long);
    err_is($r, 504, 'timeout', undef, 'kvgate_timeout 50ms: 504', qr/did not complete within 50 ms/);
    ok(time - $t0 < 5, '  answered at the deadline');
    my ($st, $h, $ev) = $g->stream('/hurry/v1/completions', $long);
    if ($st == 200) {
        my $last = $ev->[-1];
        ok(ref $last && $last->{error} && $last->{error}{code} eq 'timeout',
           'streaming past the deadline: the stream ends with an error event');
    } else {
        is($st, 504, 'streaming past the deadline before the first token: 504');
    }
    my $idle = $g->wait_status(sub { $_[0]{scheduler}{running} == 0 }, 'the engine to stop both requests');
    is($idle->{scheduler}{running}, 0, '  and the engine stopped working on both');
}

$g->stop;

# ---- 429: the engine is saturated ----------------------------------------------------------

{
    # (stall => 'off': the engine is stopped to hold the requests, however long that takes)
    my $s = Kvgate::Gateway->new(engine => [ '--max-waiting', '1', '--max-running', '1' ], workers => 1,
                                 stall => 'off');
    my @pids;
    my $dir = $s->t->prefix;
    # "At once" for certain: the engine is stopped (SIGSTOP) until all five are in
    # nginx, so that it takes them together, however late a forked client starts.
    kill 'STOP', $s->engine->pid;
    for my $i (1 .. 5) {
        my $pid = fork // die;
        if (!$pid) {
            my $sock = $s->send_raw('/v1/completions', { %$ok, max_tokens => 480, temperature => 1.0, seed => $i });
            my ($status, $h, $body) = $s->parse_http($s->read_all($sock, 60));
            open my $fh, '>', "$dir/r$i.json" or POSIX::_exit(1);
            print $fh JSON::PP->new->encode({ status => $status, body => eval { JSON::PP->new->decode($body) },
                                              retry => $h->{'retry-after'} });
            close $fh;
            POSIX::_exit(0);
        }
        push @pids, $pid;
    }
    my $in = $s->wait_in_nginx(5, 20);
    kill 'CONT', $s->engine->pid;
    is($in, 5, 'five requests in nginx while the engine is stopped');
    waitpid $_, 0 for @pids;
    my (%by, $retry, $code);
    for my $i (1 .. 5) {
        my $j = eval { JSON::PP->new->decode($s->t->read_file("r$i.json")) } // {};
        $by{ $j->{status} // 0 }++;
        if (($j->{status} // 0) == 429) {
            $retry = $j->{retry};
            $code = $j->{body}{error}{code};
        }
    }
    ok($by{429} && $by{200} && $by{429} + $by{200} == 5,
       "5 at once at --max-waiting 1 --max-running 1: $by{200} answered, " . ($by{429} // 0) . ' refused');
    is($code, 'rate_limit_exceeded', '  429 code rate_limit_exceeded');
    is($retry, 1, '  with Retry-After: 1');
    $s->stop;
}

done_testing;
