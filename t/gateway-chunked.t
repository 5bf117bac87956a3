#!/usr/bin/perl
# Request bodies sent with Transfer-Encoding: chunked get the same answers as the same
# bodies sent with Content-Length: one chunk, many small chunks (also in separate
# writes, so that nginx reads them into several buffers), chunk extensions, trailers,
# a body large enough that nginx spills it to a temporary file, and an empty chunked
# body (a clean 400). Run under the ASan/UBSan module too: copying a chunked body
# once passed a NULL buffer to memcpy.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Socket::INET;
use JSON::PP;
use Test::More;
use Time::HiRes qw(sleep);
use Kvgate::Gateway;

# A small body buffer: the large body below goes to a temporary file.
my $g = Kvgate::Gateway->new(server => 'client_body_buffer_size 1k;');

my $json = JSON::PP->new->canonical;

# Sends a chunked POST: $pieces is a list of chunk lines and data exactly as they go
# on the wire after the headers; each element is one write (with a pause between
# writes when $pause). Returns (status, body).
sub chunked {
    my ($path, $pieces, $pause) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $g->t->port(0),
                                  Proto => 'tcp', Timeout => 5) or die "connect: $!";
    $s->syswrite("POST $path HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 . "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    for my $p (@$pieces) {
        sleep $pause if $pause;
        $s->syswrite($p);
    }
    my ($status, undef, $body) = $g->parse_http($g->read_all($s, 30));
    close $s;
    return ($status, $body);
}

# The chunks of $data, $size bytes each (the last may be shorter), then the last chunk.
sub chunks_of {
    my ($data, $size, %o) = @_;
    my @p;
    for (my $i = 0; $i < length $data; $i += $size) {
        my $c = substr($data, $i, $size);
        push @p, sprintf('%x%s', length $c, $o{ext} // '') . "\r\n$c\r\n";
    }
    push @p, "0\r\n" . ($o{trailer} // '') . "\r\n";
    return \@p;
}

sub text_of {
    my ($body) = @_;
    my $d = eval { $json->decode($body) } or return undef;
    return $d->{choices}[0]{text} // $d->{choices}[0]{message}{content};
}

my $req = { model => $Kvgate::Gateway::MODEL, prompt => 'Once upon a time', max_tokens => 8,
            temperature => 0 };
my $body = $json->encode($req);
my $want = $g->completion($req)->{json}{choices}[0]{text};
ok(defined $want && length $want, 'the answer with Content-Length');

my @cases = (
    [ 'one chunk', chunks_of($body, length $body) ],
    [ 'one byte per chunk', chunks_of($body, 1) ],
    [ 'chunk extensions', chunks_of($body, 7, ext => ';name=value;x') ],
    [ 'a trailer', chunks_of($body, 16, trailer => "X-Trailer: 1\r\n") ],
);
for my $c (@cases) {
    my ($status, $got) = chunked('/v1/completions', $c->[1]);
    is($status, 200, "$c->[0]: 200");
    is(text_of($got), $want, "  the same text");
}

{
    # every chunk in a write of its own: nginx reads them one by one
    my ($status, $got) = chunked('/v1/completions', chunks_of($body, 5), 0.002);
    is($status, 200, 'small chunks in separate writes: 200');
    is(text_of($got), $want, '  the same text');
}

{
    # chunk size lines and data in separate writes, and the last chunk alone
    my @p = map { /\A([^\r]*\r\n)(.*)\z/s ? ($1, $2) : ($_) } @{ chunks_of($body, 9) };
    my ($status, $got) = chunked('/v1/completions', \@p, 0.002);
    is($status, 200, 'size lines and data in separate writes: 200');
    is(text_of($got), $want, '  the same text');
}

{
    my $chat = { model => $Kvgate::Gateway::MODEL, max_tokens => 6, temperature => 0,
                 messages => [ { role => 'user', content => 'Tell me a story' } ] };
    my $w = $g->chat($chat)->{json}{choices}[0]{message}{content};
    my ($status, $got) = chunked('/v1/chat/completions', chunks_of($json->encode($chat), 3));
    is($status, 200, 'chat completion, chunked: 200');
    is(text_of($got), $w, '  the same text');
}

{
    # past client_body_buffer_size (1k): nginx writes it to a temporary file
    my $long = { %$req, prompt => join(' ', ('Lily and Tom went to the park.') x 40) };
    my $lb = $json->encode($long);
    cmp_ok(length $lb, '>', 1024, 'a body of ' . length($lb) . ' bytes');
    my $w = $g->completion($long)->{json}{choices}[0]{text};
    my ($status, $got) = chunked('/v1/completions', chunks_of($lb, 100));
    is($status, 200, '  chunked, spilled to a temporary file: 200');
    is(text_of($got), $w, '  the same text as with Content-Length');
    ($status, $got) = chunked('/v1/completions', chunks_of($lb, 333), 0.001);
    is($status, 200, '  in separate writes: 200');
    is(text_of($got), $w, '  the same text');
}

{
    my ($status, $got) = chunked('/v1/completions', [ "0\r\n\r\n" ]);
    is($status, 400, 'an empty chunked body: 400');
    my $e = eval { $json->decode($got)->{error} } // {};
    ok(length($e->{message} // ''), "  an OpenAI error: '" . ($e->{message} // '') . "'");
}

$g->stop;

done_testing;
