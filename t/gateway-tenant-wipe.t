#!/usr/bin/env perl
# An operator wipes a tenant's blocks on a running engine through kvgate_admin (issue 31):
# tenants A and B cache one long prompt on an engine with a disk tier; POST
# /admin/tenants/A/wipe answers 200 with the engine's pool count, A's repeat is computed
# afresh (0 cached tokens, the same answer) and B's still hits. After a clean restart
# (the pool persisted to disk) the wipe counts A's disk blocks, and after one more
# restart A still misses while B hits from disk. A location's default tenant is wiped by
# its name (/admin/default-tenants/default/wipe), a percent-encoded name is decoded,
# bad admin requests get JSON 4xx, an engine that does not answer within kvgate_timeout
# (stopped) and one that is down are named in a 502, and /metrics counts the wipes. The
# admin location is protected with allow/deny as the documentation says. Behind a group of
# two engines both are asked, and one down is named while the other still wipes.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Temp qw(tempdir);
use JSON::PP;
use Test::More;
use Kvgate::Gateway;

my $dir = tempdir('kvgate-gw-wipe-XXXXXX', TMPDIR => 1, CLEANUP => 1);
my $g = Kvgate::Gateway->new(
    engine => ['--kv-disk', "$dir/kv", '--kv-disk-size', '4M'],
    locations => "        location /admin/ { kvgate_admin; kvgate_timeout 10s; "
               . "allow 127.0.0.1; deny all; }\n"
               # far below kvgate_engine_stall (2 s): a stopped engine is silent, not stalled yet
               . "        location /admin-fast/ { kvgate_admin; kvgate_timeout 300ms; }\n");

my $P = join ' ', ('Once upon a time, there was a little girl named Lily. She loved to play outside '
                   . 'in the park with her friends. One day, she saw a big red ball under a tree.') x 3;

sub ask {
    my ($tenant) = @_;
    return $g->completion({ prompt => $P, max_tokens => 16, temperature => 0 },
                          defined $tenant ? ('X-Tenant-Id' => $tenant) : ());
}
sub text { return $_[0]{json}{choices}[0]{text} // '' }
sub cached { return $_[0]{json}{usage}{prompt_tokens_details}{cached_tokens} // -1 }
sub admin {
    my ($method, $path) = @_;
    return $g->t->request($method, "/admin$path");
}
sub restart {
    $g->engine->stop;
    $g->engine->restart;
    $g->wait_up;
}

# ---- A and B cache the prompt -------------------------------------------------------
my $a1 = ask('A');
is($a1->{status}, 200, 'A: 200') or diag($a1->{body});
my $pt = $a1->{json}{usage}{prompt_tokens};
ok($pt >= 128, "the prompt has $pt tokens");
my $full = int(($pt - 1) / 16) * 16;
my $nb = int($pt / 16);
is($a1->{headers}{'x-kvgate-cache'}, 'miss', '  a miss');
is(cached(ask('A')), $full, "A again: $full cached tokens");
is(ask('B')->{headers}{'x-kvgate-cache'}, 'miss', 'B: a miss (its own cache)');
is(cached(ask('B')), $full, 'B again: a hit');

# ---- wipe A in the pool -------------------------------------------------------------
my $w = admin('POST', '/tenants/A/wipe');
is($w->{status}, 200, 'POST /admin/tenants/A/wipe: 200') or diag($w->{body});
is($w->{headers}{'content-type'}, 'application/json', '  JSON');
my $j = $w->{json} // {};
is($j->{tenant}, 'A', '  names the tenant');
ok(JSON::PP::is_bool($j->{default_tenant}) && !$j->{default_tenant}, '  a named tenant');
is(scalar @{ $j->{engines} // [] }, 1, '  one engine');
my $e = $j->{engines}[0] // {};
ok($e->{ok} && $e->{engine} eq $g->engine_label, "  it wiped ($e->{engine})");
ok(($e->{wiped}{pool} // 0) >= $nb, "  $e->{wiped}{pool} pool blocks (the prompt's $nb at least)");
is($e->{wiped}{host}, 0, '  0 host blocks (no host tier)');
is($e->{wiped}{disk}, 0, '  0 disk blocks (nothing was evicted yet)');
is_deeply($j->{wiped}, $e->{wiped}, '  the sums equal the one engine\'s counts');

my $a2 = ask('A');
is($a2->{headers}{'x-kvgate-cache'}, 'miss', "A's repeat after the wipe: a miss");
is(cached($a2), 0, '  0 cached tokens');
is(text($a2), text($a1), '  the same answer');
is(cached(ask('B')), $full, "B's repeat: still a hit");

# ---- the disk: persisted at a clean stop, wiped on the next engine ------------------
restart();
$w = admin('POST', '/tenants/A/wipe');
is($w->{status}, 200, 'after a clean restart, POST /admin/tenants/A/wipe: 200') or diag($w->{body});
$e = ($w->{json}{engines} // [])->[0] // {};
ok(($e->{wiped}{disk} // 0) >= $nb, "  $e->{wiped}{disk} disk blocks (A's prompt was persisted)");
is($e->{wiped}{pool}, 0, '  none in the new engine\'s pool');
restart();
my $a3 = ask('A');
is(cached($a3), 0, 'after one more restart A still misses: its disk slots are gone');
is(text($a3), text($a1), '  the same answer');
my $b3 = ask('B');
is(cached($b3), $full, 'B hits, from disk');
is(text($b3), text($a1), '  the same answer');

# ---- a location's default tenant, a percent-encoded name ------------------------------
ask(undef);
is(cached(ask(undef)), $full, 'the default tenant caches the prompt');
$w = admin('POST', '/default-tenants/default/wipe');
is($w->{status}, 200, 'POST /admin/default-tenants/default/wipe: 200') or diag($w->{body});
ok($w->{json}{default_tenant}, '  a default tenant');
ok(($w->{json}{wiped}{pool} // 0) >= $nb, "  $w->{json}{wiped}{pool} pool blocks");
is(cached(ask(undef)), 0, '  its repeat misses');
is(cached(ask('A')), $full, '  A (re-cached before) is untouched');
ask('a/b');
$w = admin('POST', '/tenants/a%2Fb/wipe/');
is($w->{status}, 200, 'a%2Fb (and a trailing slash): 200');
is($w->{json}{tenant}, 'a/b', '  decoded to "a/b"');
ok(($w->{json}{wiped}{pool} // 0) >= $nb, '  its blocks wiped');

# ---- bad requests --------------------------------------------------------------------
my $r = admin('GET', '/tenants/A/wipe');
is($r->{status}, 405, 'GET: 405');
is($r->{headers}{allow}, 'POST', '  Allow: POST');
is($r->{json}{error}{code}, 'method_not_allowed', '  a JSON error');
$r = admin('POST', '/tenants//wipe');
is($r->{status}, 400, 'an empty tenant: 400');
like($r->{json}{error}{message} // '', qr/tenant is missing/, '  "the tenant is missing"');
is($r->{json}{error}{code}, 'invalid_tenant', '  invalid_tenant');
$r = admin('POST', '/tenants/' . ('t' x 257) . '/wipe');
is($r->{status}, 400, 'a tenant of 257 bytes: 400');
like($r->{json}{error}{message} // '', qr/longer than 256 bytes/, '  names the limit');
is(admin('POST', '/tenants/' . ('t' x 256) . '/wipe')->{status}, 200, 'one of 256 bytes: 200');
$r = admin('POST', '/default-tenants/' . ('t' x 256) . '/wipe');
is($r->{status}, 400, 'a default tenant of 256 bytes: 400 (its salt is one byte longer)');
# (nginx itself refuses a %00 in the path before any handler: the module checks anyway)
$r = admin('POST', '/tenants/a%00b/wipe');
is($r->{status}, 400, 'a tenant with a NUL byte: 400');
ok(defined $r->{json}{error}{message}, '  a JSON error');
for my $p ('/tenants/A/erase', '/tenants/A', '/users/A/wipe', '/wipe', '/') {
    $r = admin('POST', $p);
    is($r->{status}, 404, "POST /admin$p: 404");
    like($r->{json}{error}{message} // '', qr{/tenants/<tenant>/wipe}, '  the usage in a JSON error');
}

my $m = $g->wait_metrics(sub { $g->metric($_[0], 'kvgate_tenant_wipes_total{result="ok"}') >= 5 },
                         'the wipes in /metrics');
is($g->metric($m, 'kvgate_tenant_wipes_total{result="ok"}'), 5, 'kvgate_tenant_wipes_total{result="ok"} 5');
ok($g->metric($m, 'kvgate_tenant_wiped_blocks_total{tier="disk"}') >= $nb,
   '  kvgate_tenant_wiped_blocks_total{tier="disk"}');
ok($g->metric($m, 'kvgate_tenant_wiped_blocks_total{tier="pool"}') >= 3 * $nb,
   '  kvgate_tenant_wiped_blocks_total{tier="pool"}');

# ---- an engine that does not answer in time ------------------------------------------
$g->engine->signal('STOP');
$r = $g->t->request('POST', '/admin-fast/tenants/A/wipe');
$g->engine->signal('CONT');
is($r->{status}, 502, 'the engine stopped (SIGSTOP): 502 after kvgate_timeout');
$e = ($r->{json}{engines} // [])->[0] // {};
is($e->{status}, 504, '  its entry: 504');
like($e->{error} // '', qr/no answer within 300 ms/, "  why: $e->{error}");

# ---- an engine that is down ----------------------------------------------------------
$g->engine->stop;
$g->wait_status(sub { !$_[0]{engine}{up} }, 'the engine seen down');
$r = admin('POST', '/tenants/A/wipe');
is($r->{status}, 502, 'the engine down: 502');
$e = ($r->{json}{engines} // [])->[0] // {};
ok(JSON::PP::is_bool($e->{ok}) && !$e->{ok}, '  its entry is not ok');
is($e->{status}, 503, '  status 503');
# (the worker that answers may have seen the death already, or learns of it now)
like($e->{error} // '', qr/not available|connection lost/, "  why: $e->{error}");
is($e->{engine}, $g->engine_label, '  named');
$m = $g->wait_metrics(sub { $g->metric($_[0], 'kvgate_tenant_wipes_total{result="failed"}') >= 2 },
                      'the failed wipes in /metrics');
is($g->metric($m, 'kvgate_tenant_wipes_total{result="failed"}'), 2, 'kvgate_tenant_wipes_total{result="failed"} 2');

$g->stop;
$g->t->check_logs;

# ---- a group of two engines: both are asked; one down is named, the other still wipes ---
my $g2 = Kvgate::Gateway->new(
    engines => [ { name => 'a' }, { name => 'b' } ], group => 'route prefix;',
    locations => "        location /admin/ { kvgate_admin pool; kvgate_timeout 10s; }\n");
$g = $g2;
ask('A');
is(cached(ask('A')), $full, 'two engines: A caches the prompt on the one routing chose');
ask('B');
$w = admin('POST', '/tenants/A/wipe');
is($w->{status}, 200, 'POST /admin/tenants/A/wipe: 200') or diag($w->{body});
is(join(',', map { $_->{engine} } @{ $w->{json}{engines} // [] }), 'a,b', '  both engines answered, in order');
ok(($w->{json}{wiped}{pool} // 0) >= $nb, "  $w->{json}{wiped}{pool} pool blocks in all");
is(cached(ask('A')), 0, '  A misses');
$g2->engine_named('b')->stop;
$w = admin('POST', '/tenants/B/wipe');
is($w->{status}, 502, 'engine b down: 502');
my %by = map { $_->{engine} => $_ } @{ $w->{json}{engines} // [] };
ok($by{a}{ok} && !$by{b}{ok}, '  a wiped, b did not');
is($by{b}{status}, 503, '  b: 503');
$g2->stop;
$g2->t->check_logs;
done_testing();
