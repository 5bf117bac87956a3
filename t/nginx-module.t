#!/usr/bin/perl
# The kvgate nginx module in a real nginx: it loads into Debian's nginx, its directives
# are validated by `nginx -t`, and until the engine connection exists every kvgate_pass
# request gets an honest OpenAI-style 503 (body consumed, keepalive intact).
# With KVGATE_ASAN=1 the same runs against the ASan+UBSan build of the module.

use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Kvgate::Test;

my $t = Kvgate::Test->new;

my $engine = 'kvgate_engine unix:%%PREFIX%%/engine.sock;';
my $server = <<'EOF';
    server {
        listen 127.0.0.1:%%PORT%%;
        server_name localhost;
        client_max_body_size 8m;

        location /v1/ {
            kvgate_pass;
        }

        location = /plain {
            return 200 "plain\n";
        }
    }
EOF

my $error_body = '{"error":{"message":"kvgate: engine not connected","type":"server_error",'
               . '"param":null,"code":"engine_unavailable"}}' . "\n";
my $error_json = JSON::PP->new->decode($error_body);

# ---- configuration checks (nginx -t) ------------------------------------------------

sub conf_fails {
    my ($http, $want, $name, %more) = @_;
    my ($rc, $out) = $t->nginx_t(http => $http, %more);
    isnt($rc, 0, "$name: nginx -t fails");
    like($out, $want, "$name: message") or diag($out);
}

{
    my ($rc, $out) = $t->nginx_t(http => "$engine\n$server");
    is($rc, 0, 'nginx -t passes with load_module and the kvgate directives') or diag($out);
    like($out, qr/test is successful/, 'nginx -t says the test is successful');
}

conf_fails("$engine\n$server", qr/unknown directive "kvgate_engine"/,
           'without load_module the directives are unknown', load_module => 0);

conf_fails("kvgate_engine tcp:1.2.3.4;\n$server",
           qr/\[emerg\] invalid value "tcp:1\.2\.3\.4" in "kvgate_engine" directive, it must be "unix:/,
           'kvgate_engine tcp:1.2.3.4');

conf_fails("kvgate_engine unix:;\n$server",
           qr/\[emerg\] invalid value "unix:" in "kvgate_engine" directive: no path in the unix domain socket/,
           'kvgate_engine unix:');

conf_fails("kvgate_engine /run/kvgate.sock;\n$server",
           qr/invalid value "\/run\/kvgate\.sock" in "kvgate_engine" directive/,
           'kvgate_engine without unix: prefix');

my $long = '/tmp/' . ('x' x 200);
conf_fails("kvgate_engine unix:$long;\n$server",
           qr/invalid value "unix:\Q$long\E" in "kvgate_engine" directive: too long path/,
           'kvgate_engine with a path longer than sun_path');

conf_fails("$engine\nkvgate_engine unix:/tmp/other.sock;\n$server",
           qr/"kvgate_engine" directive is duplicate/, 'duplicate kvgate_engine');

conf_fails("$engine\nserver { listen 127.0.0.1:%%PORT%%; location / { kvgate_pass; kvgate_pass; } }",
           qr/"kvgate_pass" directive is duplicate/, 'duplicate kvgate_pass');

conf_fails("$engine\nserver { listen 127.0.0.1:%%PORT%%; location / { kvgate_pass on; } }",
           qr/invalid number of arguments in "kvgate_pass" directive/, 'kvgate_pass takes no arguments');

conf_fails("server { listen 127.0.0.1:%%PORT%%; $engine location / { kvgate_pass; } }",
           qr/"kvgate_engine" directive is not allowed here/, 'kvgate_engine only in http{}');

conf_fails("server { listen 127.0.0.1:%%PORT%%; location / { kvgate_pass; } }",
           qr/"kvgate_pass" in \S+check-\d+\.conf:\d+ requires "kvgate_engine"/,
           'kvgate_pass without kvgate_engine');

SKIP: {
    # The shipped example must stay valid as the directives evolve. It names the system's
    # log paths, which only root may open.
    skip 'conf.d/kvgate.conf check needs root (system log paths)', 2 if $> != 0;
    my $example = Kvgate::Test::repo_root() . '/conf.d/kvgate.conf';
    my $text = $t->read_file($example);
    ok($text =~ s{^load_module\s+\S+;}{'load_module ' . $t->module . ';'}me,
       'conf.d/kvgate.conf has a load_module line');
    my ($rc, $out) = $t->nginx_t(conf => $text);
    is($rc, 0, 'conf.d/kvgate.conf passes nginx -t') or diag($out);
}

# ---- a running nginx -----------------------------------------------------------------

$t->write_config(http => "$engine\n$server");
$t->run;

sub is_unavailable {
    my ($r, $name) = @_;
    is($r->{status}, 503, "$name: 503");
    is($r->{headers}{'content-type'}, 'application/json', "$name: Content-Type");
    is($r->{headers}{'retry-after'}, '1', "$name: Retry-After");
    is($r->{body}, $error_body, "$name: body is the OpenAI error object");
    is_deeply($r->{json}, $error_json, "$name: body decodes as JSON");
}

is_unavailable($t->get('/v1/models'), 'GET /v1/models');

is_unavailable($t->post_json('/v1/chat/completions',
                   { model => 'm', messages => [ { role => 'user', content => 'hi' } ] }),
               'POST /v1/chat/completions with a JSON body');

{
    my $r = $t->request('HEAD', '/v1/models');
    is($r->{status}, 503, 'HEAD: 503');
    is($r->{body}, '', 'HEAD: no body');
    is($r->{headers}{'content-length'}, length $error_body, 'HEAD: Content-Length of the error');
}

{
    # Well past client_body_buffer_size: discarding must not spool it to disk.
    my $r = $t->post_json('/v1/completions', '{"prompt":"' . ('a' x (4 << 20)) . '"}');
    is_unavailable($r, 'POST with a 4 MiB body');
}

{
    # If the body were not consumed, the second request on the connection would be
    # parsed out of the first one's body.
    my $body = '{"model":"m","prompt":"GET /plain HTTP/1.1\r\n\r\n"}';
    my $buf = $t->raw(
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        . "Content-Length: " . length($body) . "\r\n\r\n$body"
        . "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
        . "5\r\n{\"a\":\r\n3\r\n1}\n\r\n0\r\n\r\n"
        . "GET /plain HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    my @r = Kvgate::Test->parse_responses($buf);
    is(scalar @r, 3, 'pipelined POST, chunked POST, GET: three responses') or diag($buf);
    is($r[0]{status}, 503, 'pipelined POST with Content-Length body: 503');
    is($r[0]{body}, $error_body, 'pipelined POST: error body');
    is($r[1]{status}, 503, 'pipelined chunked POST: 503');
    is($r[2]{status}, 200, 'request after the bodies: served by its own location');
    is($r[2]{body}, "plain\n", 'request after the bodies: body');
}

{
    my $r = $t->get('/plain');
    is($r->{status}, 200, 'a location without kvgate_pass is untouched');
    is($r->{body}, "plain\n", 'its body');
}

{
    my $r = $t->get('/elsewhere');
    is($r->{status}, 404, 'a location outside kvgate_pass: nginx 404');
}

like($t->read_file('logs/error.log'), qr/kvgate: module loaded, libkvgate 0\.1\.0/,
     'the module logs the version from the linked libkvgate.a');

my @spooled = glob($t->prefix . '/client_body_temp/*');
is(scalar @spooled, 0, 'no request body was spooled to disk');

$t->stop;

done_testing;
