#!/usr/bin/perl
# Huge prompts never hold the worker's event loop: a body over the limit the engine's
# context implies is refused with 413 before it is read (declared, or chunked as it
# arrives), a prompt whose byte length alone proves it too long for the context gets
# the 400 tokenizing would give, and prompts parsed and tokenized in kvgate_thread_pool
# give exactly what the event loop gives. A client that leaves while its prompt is in
# the pool leaves nginx healthy (the harness fails the file on any alert or ASan line).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Socket::INET;
use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep time);
use Kvgate::Gateway;

my $g = Kvgate::Gateway->new(locations => <<'EOF');
        location /pool/v1/ {
            kvgate_pass;
            kvgate_thread_pool default min_bytes=0;
            client_max_body_size 0;
            error_log %%PREFIX%%/logs/pool.log debug;
        }
        location /inline/v1/ {
            kvgate_pass;
            kvgate_thread_pool off;
            client_max_body_size 0;
        }
        location /norm/v1/ {
            kvgate_pass;
            kvgate_thread_pool default min_bytes=1k;
            kvgate_normalize all;
        }
        location /norm-inline/v1/ {
            kvgate_pass;
            kvgate_thread_pool off;
            kvgate_normalize all;
        }
EOF
my $t = $g->t;

my $base = { model => 'stories260K', max_tokens => 12, temperature => 0 };

sub open_raw {
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port(0), Proto => 'tcp',
                                  Timeout => 5) or die "connect: $!";
    return $s;
}

# ---- 413: over the derived limit -----------------------------------------------------------

my $limit;
{
    # only the headers: the answer must come without the body
    my $raw = "POST /pool/v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            . "Content-Length: 100000000\r\nConnection: close\r\n\r\n";
    my $t0 = time;
    my ($r) = Kvgate::Test->parse_responses($t->raw($raw, timeout => 10));
    is($r->{status}, 413, 'Content-Length of 100 MB (client_max_body_size 0): 413 before the body');
    my $e = eval { decode_json($r->{body}) }->{error} // {};
    is($e->{code}, 'request_too_large', '  code request_too_large');
    is($e->{type}, 'invalid_request_error', '  type invalid_request_error');
    like($e->{message} // '', qr/\((\d+) bytes: the most a prompt of the model's context of 512 tokens can take\)/,
         "  message names the limit: $e->{message}");
    ($limit) = ($e->{message} // '') =~ /\((\d+) bytes/;
    ok($limit && $limit > 512 && $limit < 100_000_000, "  a limit of $limit bytes");
}

{
    # the default location: client_max_body_size 1m is above the derived limit
    my $body = encode_json({ %$base, prompt => 'z' x ($limit + 10) });
    my $r = $g->post('/v1/completions', $body);
    is($r->{status}, 413, 'a body just over the derived limit (under client_max_body_size 1m): 413');
    like($r->{json}{error}{message} // '', qr/context of 512 tokens/, '  naming the derived limit');
}

{
    # chunked: refused as the bytes arrive, the rest never read
    my $head = "POST /pool/v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
             . "Content-Type: application/json\r\nConnection: close\r\n\r\n";
    my $s = open_raw();
    $s->syswrite($head);
    my $chunk = 'a' x 16384;
    my $sent = 0;
    while ($sent <= $limit + 16384) {
        last unless defined $s->syswrite(sprintf("%x\r\n%s\r\n", length $chunk, $chunk));
        $sent += length $chunk;
    }
    my $buf = $g->read_all($s, 10);
    close $s;
    my ($r) = Kvgate::Test->parse_responses($buf);
    is($r && $r->{status}, 413, "a chunked body past the limit (no last chunk sent): 413");
    like($r ? $r->{body} : '', qr/"code":"request_too_large"/, '  as an OpenAI error');
    like($r ? $r->{body} : '', qr/context of 512 tokens/, '  naming the derived limit');
}

{
    # a valid chunked body in many small chunks, one empty: served
    my $body = encode_json({ %$base, prompt => 'Once upon a time' });
    my $raw = "POST /pool/v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            . "Content-Type: application/json\r\nConnection: close\r\n\r\n";
    for (my $i = 0; $i < length $body; $i += 7) {
        my $part = substr($body, $i, 7);
        $raw .= sprintf("%x\r\n%s\r\n", length $part, $part);
    }
    $raw .= "0\r\n\r\n";
    my ($r) = Kvgate::Test->parse_responses($t->raw($raw));
    is($r && $r->{status}, 200, 'a chunked body under the limit, in 7-byte chunks: 200');
}

# ---- 400: too long by its byte length alone --------------------------------------------------

for my $where ('/pool', '/inline') {
    # under the body limit, far over what 512 tokens can hold
    my $prompt = 'abcdefgh ' x int(($limit - 200) / 9 / 2);
    my $r = $g->post("$where/v1/completions", { %$base, prompt => $prompt });
    is($r->{status}, 400, "$where: a prompt of " . length($prompt) . " bytes: 400");
    is($r->{json}{error}{code}, 'context_length_exceeded', '  code context_length_exceeded');
    is($r->{json}{error}{param}, 'prompt', '  param prompt');
    like($r->{json}{error}{message} // '',
         qr/^This model's maximum context length is 512 tokens\. However, your prompt resulted in at least \d+ tokens, which leaves no room for a completion\.$/,
         '  the message tokenizing would give, as a lower bound');
    $r = $g->post("$where/v1/chat/completions",
                  { %$base, messages => [ { role => 'user', content => $prompt } ] });
    is($r->{status}, 400, "$where: the same as a chat message: 400");
    is($r->{json}{error}{param}, 'messages', '  param messages');
}

# ---- the thread pool gives what the event loop gives ------------------------------------------

my @prompts = (
    'Once upon a time',
    join(' ', ('Lily had a red ball and a little dog named Max.') x 40),
    "Tom and Sue went to the park.\n\nThey saw a big \x{e9}l\x{e9}phant!  " x 20,
    join(' ', ('The sun was warm.') x 120),
);
my $i = 0;
for my $p (@prompts) {
    $i++;
    my %solo;
    for my $where ('/pool', '/inline', '') {
        my $r = $g->post("$where/v1/completions", { %$base, prompt => $p });
        $solo{$where} = $r;
    }
    is($solo{'/pool'}{status}, $solo{'/inline'}{status}, "prompt $i (" . length($p) . " chars): same status "
       . $solo{'/pool'}{status}) or diag($solo{'/pool'}{body});
    is($solo{'/pool'}{json}{choices}[0]{text}, $solo{'/inline'}{json}{choices}[0]{text}, '  same text in the pool');
    is_deeply($solo{'/pool'}{json}{usage}, $solo{'/inline'}{json}{usage}, '  same usage');
    is($solo{''}{json}{choices}[0]{text}, $solo{'/inline'}{json}{choices}[0]{text},
       '  and the default location (pool from 16k) the same');

    my @msgs = ({ role => 'system', content => 'You tell stories.' }, { role => 'user', content => $p });
    my $a = $g->post('/pool/v1/chat/completions', { %$base, messages => \@msgs });
    my $b = $g->post('/inline/v1/chat/completions', { %$base, messages => \@msgs });
    is($a->{status}, $b->{status}, "  chat: same status $a->{status}");
    is($a->{json}{choices}[0]{message}{content}, $b->{json}{choices}[0]{message}{content}, '  chat: same content');
    is_deeply($a->{json}{usage}, $b->{json}{usage}, '  chat: same usage');

    my $n = $g->post('/norm/v1/completions', { %$base, prompt => $p });
    my $m = $g->post('/norm-inline/v1/completions', { %$base, prompt => $p });
    is($n->{json}{choices}[0]{text}, $m->{json}{choices}[0]{text}, '  normalized: same text');
    is_deeply($n->{json}{usage}, $m->{json}{usage}, '  normalized: same usage');
}

{
    # the same prompt twice in the pool: the second hits the first one's cached blocks,
    # so the pool's hashes are the engine connection's
    my $p = join(' ', ('A cat sat on a mat in the sun.') x 30);
    my $r1 = $g->post('/inline/v1/completions', { %$base, prompt => $p }, 'X-Tenant-Id' => 'hashes');
    my $r2 = $g->post('/pool/v1/completions', { %$base, prompt => $p }, 'X-Tenant-Id' => 'hashes');
    ok(($r2->{json}{usage}{prompt_tokens_details}{cached_tokens} // 0) > 0,
       'a prompt cached from the event loop hits from the pool (same block hashes)')
        or diag($r2->{body});
}

ok($t->wait_log('logs/pool.log', qr/kvgate: prompt task done/),
   'the /pool/ location tokenized in the thread pool (debug log)');

# ---- a client that leaves while its prompt is in the pool ------------------------------------

{
    my $p = join(' ', ('The dog ran after the ball in the big green park.') x 60);
    my $json = encode_json({ %$base, prompt => $p, max_tokens => 50 });
    my @gone;
    for (1 .. 24) {
        my $s = open_raw();
        $s->syswrite("POST /pool/v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     . "Content-Length: " . length($json) . "\r\nConnection: close\r\n\r\n$json");
        push @gone, $s;
    }
    close $_ for @gone;
    my $r = $g->wait_status(sub { $_[0]{scheduler}{running} == 0 && $_[0]{scheduler}{waiting} == 0 },
                            'the engine idle after 24 clients left');
    ok($r, 'the engine is idle after the clients left');
    my $ok = $g->post('/pool/v1/completions', { %$base, prompt => 'Once upon a time' });
    is($ok->{status}, 200, 'then a request in the pool is served');
    $ok = $g->post('/inline/v1/completions', { %$base, prompt => 'Once upon a time' });
    is($ok->{status}, 200, '  and one in the event loop');
}

$g->stop;
done_testing;
