#!/usr/bin/perl
# The kvgate nginx module in a real nginx: it loads into Debian's nginx, every directive
# is validated by `nginx -t` with a message naming it and the value, and while no engine
# is there every kvgate_pass request gets an honest OpenAI-style 503 with Retry-After
# (body consumed, keepalive intact).
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

for my $v (qw(off 300ms 2s)) {
    my ($rc, $out) = $t->nginx_t(http => "$engine\nkvgate_engine_stall $v;\n$server");
    is($rc, 0, "kvgate_engine_stall $v: nginx -t passes") or diag($out);
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

conf_fails("$engine\nserver { listen 127.0.0.1:%%PORT%%; location / { kvgate_pass a b; } }",
           qr/invalid number of arguments in "kvgate_pass" directive/, 'kvgate_pass takes at most a group name');

conf_fails("$engine\nserver { listen 127.0.0.1:%%PORT%%; location / { kvgate_pass on; } }",
           qr/"kvgate_pass on" in \S+:\d+: there is no "kvgate_engines on" block/, 'kvgate_pass names an unknown group');

conf_fails("$engine\nserver { listen 127.0.0.1:%%PORT%%; location /admin/ { kvgate_admin nosuch; } }",
           qr/"kvgate_admin nosuch" in \S+:\d+: there is no "kvgate_engines nosuch" block/,
           'kvgate_admin names an unknown group');
conf_fails("server { listen 127.0.0.1:%%PORT%%; location /admin/ { kvgate_admin; } }",
           qr/"kvgate_admin" in \S+check-\d+\.conf:\d+ requires "kvgate_engine"/, 'kvgate_admin without kvgate_engine');
conf_fails("$engine\nserver { listen 127.0.0.1:%%PORT%%; location / { kvgate_pass; kvgate_admin; } }",
           qr/"kvgate_admin" cannot share a location with kvgate_pass/, 'kvgate_pass and kvgate_admin in one location');

conf_fails("kvgate_engines g { route prefix; }\n$server",
           qr/"kvgate_engines g" has no "engine"/, 'kvgate_engines without an engine');

conf_fails("kvgate_engines g { engine unix:/tmp/a.sock; engine unix:/tmp/a.sock; }\n$server",
           qr/engine "unix:\/tmp\/a\.sock" is duplicate in "kvgate_engines g"/, 'kvgate_engines with an engine twice');

conf_fails("kvgate_engines g { engine unix:/tmp/a.sock; balance_factor 1; }\n$server",
           qr/invalid value "1" in "balance_factor" of "kvgate_engines g": it must be a number more than 1/, 'balance_factor 1');

conf_fails("kvgate_engines g { engine unix:/tmp/a.sock; route nearest; }\n$server",
           qr/invalid value "nearest" in "route" of "kvgate_engines g"/, 'unknown route policy');

conf_fails("server { listen 127.0.0.1:%%PORT%%; $engine location / { kvgate_pass; } }",
           qr/"kvgate_engine" directive is not allowed here/, 'kvgate_engine only in http{}');

conf_fails("server { listen 127.0.0.1:%%PORT%%; location / { kvgate_pass; } }",
           qr/"kvgate_pass" in \S+check-\d+\.conf:\d+ requires "kvgate_engine"/,
           'kvgate_pass without kvgate_engine');

# Every directive's bad values name the directive and the value.
my @bad = (
    [ 'kvgate_buckets 128 64;', qr/invalid value in "kvgate_buckets" directive: .*64/, 'kvgate_buckets not increasing' ],
    [ 'kvgate_buckets lots;', qr/invalid value in "kvgate_buckets" directive: .*lots/, 'kvgate_buckets not a number' ],
    [ 'kvgate_buckets 128; kvgate_buckets 256;', qr/"kvgate_buckets" directive is duplicate/, 'kvgate_buckets twice' ],
    [ 'kvgate_normalize spaces sparkles;', qr/invalid value "sparkles" in "kvgate_normalize" directive: unknown normalize step/,
      'kvgate_normalize with an unknown step' ],
    [ 'kvgate_normalize off spaces;', qr/"off" in "kvgate_normalize" directive cannot be combined/,
      'kvgate_normalize off with steps' ],
    [ 'kvgate_cache_min_tokens many;', qr/invalid value "many" in "kvgate_cache_min_tokens" directive, it must be an integer from 0/,
      'kvgate_cache_min_tokens many' ],
    [ 'kvgate_cache_min_tokens -1;', qr/invalid value "-1" in "kvgate_cache_min_tokens" directive/, 'kvgate_cache_min_tokens -1' ],
    [ 'kvgate_max_n 0;', qr/invalid value "0" in "kvgate_max_n" directive, it must be an integer from 1 to 16/, 'kvgate_max_n 0' ],
    [ 'kvgate_max_n 17;', qr/invalid value "17" in "kvgate_max_n" directive/, 'kvgate_max_n 17' ],
    [ 'kvgate_max_tokens -5;', qr/invalid value "-5" in "kvgate_max_tokens" directive/, 'kvgate_max_tokens -5' ],
    [ 'kvgate_timeout 0;', qr/invalid value "0" in "kvgate_timeout" directive, it must be greater than 0/, 'kvgate_timeout 0' ],
    [ 'kvgate_timeout forever;', qr/invalid value "forever" in "kvgate_timeout" directive, it must be a time/, 'kvgate_timeout forever' ],
    [ 'kvgate_cache_ttl soon;', qr/invalid value "soon" in "kvgate_cache_ttl" directive/, 'kvgate_cache_ttl soon' ],
    [ 'kvgate_engine_stall 100ms;',
      qr/invalid value "100ms" in "kvgate_engine_stall" directive, it must be "off" or a time of at least 300ms/,
      'kvgate_engine_stall 100ms (under three idle heartbeats)' ],
    [ 'kvgate_engine_stall never;', qr/invalid value "never" in "kvgate_engine_stall" directive/,
      'kvgate_engine_stall never' ],
    [ 'kvgate_engine_stall 1s; kvgate_engine_stall 2s;', qr/"kvgate_engine_stall" directive is duplicate/,
      'kvgate_engine_stall twice' ],
    [ 'kvgate_route_blocks 0;', qr/invalid value "0" in "kvgate_route_blocks" directive/, 'kvgate_route_blocks 0' ],
    [ 'kvgate_answer_pattern_steps 999;', qr/invalid value "999" in "kvgate_answer_pattern_steps" directive, it must be an integer from 1000 to 1000000000/,
      'kvgate_answer_pattern_steps 999' ],
    [ 'kvgate_answer_pattern_steps 5000 4000;', qr/invalid value "4000" in "kvgate_answer_pattern_steps" directive, a request's steps must be at least one sample's \(5000\)/,
      "kvgate_answer_pattern_steps: a request's below a sample's" ],
    [ 'kvgate_answer_pattern_steps 1e6;', qr/invalid value "1e6" in "kvgate_answer_pattern_steps" directive/,
      'kvgate_answer_pattern_steps 1e6' ],
    [ 'kvgate_tenant_required maybe;', qr/invalid value "maybe" in "kvgate_tenant_required" directive/,
      'kvgate_tenant_required maybe' ],
    [ 'kvgate_default_tenant ' . ('t' x 300) . ';', qr/"kvgate_default_tenant" is longer than 255 bytes/,
      'kvgate_default_tenant too long' ],
    [ 'kvgate_tenant $http_x_tenant $extra;', qr/invalid number of arguments in "kvgate_tenant" directive/,
      'kvgate_tenant with two values' ],
);
for my $b (@bad) {
    conf_fails("$engine\n$b->[0]\n$server", $b->[1], $b->[2]);
}
conf_fails("$engine\nserver { listen 127.0.0.1:%%PORT%%; location / { kvgate_pass; kvgate_metrics; } }",
           qr/"kvgate_metrics" cannot share a location with kvgate_pass/, 'kvgate_pass and kvgate_metrics in one location');
{
    my ($rc, $out) = $t->nginx_t(http => "$engine\nkvgate_tenant \$http_x_tenant_id;\nkvgate_tenant_required on;\n"
        . "kvgate_default_tenant anonymous;\nkvgate_cache_min_tokens 256;\nkvgate_buckets 512 4096;\n"
        . "kvgate_normalize newlines trailing;\nkvgate_cache_ttl 10m;\nkvgate_timeout 2m;\nkvgate_max_tokens 4096;\n"
        . "kvgate_max_n 8;\nkvgate_route_blocks 4;\nkvgate_answer_pattern_steps 200000 800000;\n"
        . "server { listen 127.0.0.1:%%PORT%%; location /v1/ { kvgate_pass; kvgate_normalize off; }\n"
        . "location = /metrics { kvgate_metrics; } location = /status { kvgate_status; }\n"
        . "location /admin/ { kvgate_admin; allow 127.0.0.1; deny all; } }");
    is($rc, 0, 'every directive with a good value: nginx -t passes') or diag($out);
}

SKIP: {
    # The shipped examples must stay valid as the directives evolve. They name the
    # system's log paths, which only root may open.
    my @examples = glob(Kvgate::Test::repo_root() . '/conf.d/*.conf');
    skip 'conf.d/*.conf checks need root (system log paths)', 2 * @examples if $> != 0;
    for my $example (@examples) {
        my $name = $example =~ s{.*/}{}r;
        my $text = $t->read_file($example);
        ok($text =~ s{^load_module\s+\S+;}{'load_module ' . $t->module . ';'}me,
           "conf.d/$name has a load_module line");
        my ($rc, $out) = $t->nginx_t(conf => $text);
        is($rc, 0, "conf.d/$name passes nginx -t") or diag($out);
    }
}

# ---- a running nginx -----------------------------------------------------------------

$t->write_config(http => "$engine\n$server");
$t->run;

sub is_unavailable {
    my ($r, $name) = @_;
    is($r->{status}, 503, "$name: 503");
    is($r->{headers}{'content-type'}, 'application/json', "$name: Content-Type");
    is($r->{headers}{'retry-after'}, '1', "$name: Retry-After");
    my $e = $r->{json}{error} // {};
    is($e->{code}, 'engine_unavailable', "$name: code engine_unavailable");
    is($e->{type}, 'server_error', "$name: type server_error");
    like($e->{message} // '', qr/^kvgate: the engine is not available/, "$name: message");
}

is_unavailable($t->get('/v1/models'), 'GET /v1/models');

is_unavailable($t->post_json('/v1/chat/completions',
                   { model => 'm', messages => [ { role => 'user', content => 'hi' } ] }),
               'POST /v1/chat/completions with a JSON body');

{
    my $r = $t->request('HEAD', '/v1/models');
    is($r->{status}, 503, 'HEAD: 503');
    is($r->{body}, '', 'HEAD: no body');
    ok($r->{headers}{'content-length'} > 0, 'HEAD: Content-Length of the error');
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
    like($r[0]{body}, qr/"code":"engine_unavailable"/, 'pipelined POST: error body');
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

ok($t->wait_log('logs/error.log', qr/kvgate: module loaded, libkvgate 0\.1\.0/),
   'the module logs the version from the linked libkvgate.a');

my @spooled = glob($t->prefix . '/client_body_temp/*');
is(scalar @spooled, 0, 'no request body was spooled to disk');

$t->stop;

done_testing;
