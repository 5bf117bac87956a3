#!/usr/bin/perl
# Routing over several engines (kvgate_engines): three stories260K engines and one
# synthetic:260K behind one `kvgate_engines pool` block. The union /v1/models; a
# request goes to an engine serving its model ($kvgate_engine); the same tenant's
# same prompt goes to the same engine and hits its cache; a killed engine fails no
# new request while the others are up, and rejoins after a restart; a model served
# by no engine is 404, by a down one 503.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Kvgate::Engine;
use Kvgate::Gateway;

my $d = Kvgate::Engine::shared_dir() . '/models/stories260K';
my $g = Kvgate::Gateway->new(
    engines => [ { name => 'a' }, { name => 'b' }, { name => 'c' },
                 { name => 's', args => [ '--model', 'synthetic:260K', '--tokenizer', "$d/tok512.bin" ] } ],
    group => 'route prefix; balance_factor 1.5;');

my $st = $g->status;
is(scalar @{ $st->{engines} }, 4, 'the status lists the four engines');
my ($syn) = map { $_->{model} } grep { $_->{name} eq 's' } @{ $st->{engines} };
ok($syn && $syn ne 'stories260K', "engine s serves another model ($syn)");

# ---- the union of the models ----------------------------------------------------------

{
    my $r = $g->t->get('/v1/models');
    is($r->{status}, 200, 'GET /v1/models: 200');
    is_deeply([ sort map { $_->{id} } @{ $r->{json}{data} } ], [ sort 'stories260K', $syn ],
              '  each model once, from all the engines');
    is($g->t->get("/v1/models/$syn")->{status}, 200, "GET /v1/models/$syn: 200");
}

# ---- model routing ----------------------------------------------------------------------

my $system = join ' ', ('Once upon a time there was a little girl named Lily.') x 12;

sub ask {
    my ($tenant, $model, $prompt) = @_;
    return $g->post('/v1/completions', { model => $model, prompt => $prompt, max_tokens => 4,
                                         temperature => 0 }, 'X-Tenant-Id' => $tenant);
}

{
    my $r = ask('t1', $syn, "$system The synthetic one.");
    is($r->{status}, 200, "a request for $syn: 200");
    ok($g->wait_log(qr/^200 t=t1 .* e=s$/), '  routed to engine s ($kvgate_engine)');
    $r = ask('t1', 'gpt-4', 'hello');
    is($r->{status}, 404, 'a model no engine serves: 404');
    is($r->{json}{error}{code}, 'model_not_found', '  model_not_found');
}

# ---- the same tenant's prefix stays on one engine and hits ----------------------------------

my %first;
for my $tenant (qw(acme globex)) {
    my $r = ask($tenant, 'stories260K', "$system One.");
    is($r->{status}, 200, "$tenant: the first request 200");
    my $line = $g->wait_log(qr/^200 t=$tenant .* e=[abc]$/);
    ($first{$tenant}) = ($line // '') =~ / e=(\w+)$/;
    $r = ask($tenant, 'stories260K', "$system Two.");
    is($r->{status}, 200, "$tenant: the second 200");
    ok($r->{json}{usage}{prompt_tokens_details}{cached_tokens} > 0,
       "$tenant: the second hits the cache of engine $first{$tenant}");
    my @l = $g->wait_log(qr/^200 t=$tenant .* e=[abc]$/, count => 2);
    is(scalar(grep { / e=$first{$tenant}$/ } @l), 2, "$tenant: both went to engine $first{$tenant}");
}

# ---- another tenant with the same text is not attracted ----------------------------------------
# Its chain is salted with its own tenant, so no engine holds any of it: the choice is by load
# (reason "load"), never "prefix", and it misses.

sub routed {
    my ($m, $reason) = @_;
    my $n = 0;
    $n += $1 while $m =~ /^kvgate_route_requests_total\{engine="\w+",reason="$reason"\} (\d+)$/mg;
    return $n;
}

{
    my $m0 = $g->metrics;
    my $r = ask('acme', 'stories260K', "$system One.");
    is($r->{status}, 200, 'acme again: 200');
    my $m1 = $g->wait_metrics(sub { routed($_[0], 'prefix') > routed($m0, 'prefix') },
                              'the request routed by its prefix');
    is(routed($m1, 'prefix'), routed($m0, 'prefix') + 1, '  routed by prefix (its chain is held)');
    $r = ask('initech', 'stories260K', "$system One.");
    is($r->{status}, 200, 'another tenant, the same text: 200');
    is($r->{json}{usage}{prompt_tokens_details}{cached_tokens}, 0, '  a miss: the cache is per tenant');
    my $m2 = $g->wait_metrics(sub { routed($_[0], 'load') > routed($m1, 'load') },
                              'the other tenant routed by load');
    is(routed($m2, 'prefix'), routed($m1, 'prefix'), '  not routed by prefix: acme\'s blocks do not attract it');
    is(routed($m2, 'load'), routed($m1, 'load') + 1, '  routed by load');
}

# ---- failover ----------------------------------------------------------------------------

{
    my $victim = $first{acme};
    $g->engine_named($victim)->kill('KILL');
    $g->wait_status(sub { !grep { $_->{name} eq $victim && $_->{up} } @{ $_[0]{engines} } },
                    "engine $victim seen down");
    my $fails = 0;
    for my $i (1 .. 6) {
        my $r = ask("t$i", 'stories260K', "$system Failover $i.");
        $fails++ if $r->{status} != 200;
    }
    is($fails, 0, "engine $victim down: no request failed");
    $g->engine_named($victim)->restart;
    ok($g->wait_status(sub { grep { $_->{name} eq $victim && $_->{up} && $_->{workers_connected} >= 2 }
                                 @{ $_[0]{engines} } }, "engine $victim rejoins"),
       "engine $victim is up again, every worker connected");

    $g->engine_named('s')->kill('KILL');
    $g->wait_status(sub { !grep { $_->{name} eq 's' && $_->{up} } @{ $_[0]{engines} } },
                    'engine s seen down');
    my $r = ask('t1', $syn, 'hello');
    is($r->{status}, 503, "$syn while its only engine is down: 503, not 404");
    # It comes back serving stories260K instead: it moves to that model's set.
    $g->engine_named('s')->restart(args => [ Kvgate::Engine::stories_args(), '--chat-template', 'plain' ]);
    ok($g->wait_status(sub { grep { $_->{name} eq 's' && $_->{up} && ($_->{model} // '') eq 'stories260K'
                                    && $_->{workers_connected} >= 2 } @{ $_[0]{engines} } },
                       'engine s back with stories260K'),
       'engine s restarted with another model: up, serving stories260K');
    my $models = $g->t->get('/v1/models');
    is_deeply([ map { $_->{id} } @{ $models->{json}{data} } ], ['stories260K'], "  $syn is gone from /v1/models");
    $r = ask('t1', $syn, 'hello');
    is($r->{status}, 404, "  $syn: 404 now that no engine serves it");
}

# ---- metrics -------------------------------------------------------------------------------

{
    my $m = $g->metrics;
    like($m, qr/^kvgate_route_requests_total\{engine="s",reason="\w+"\} [1-9]/m,
         'kvgate_route_requests_total counts by engine');
    like($m, qr/^kvgate_engine_connected\{engine="a"\} [01]$/m, 'kvgate_engine_connected by engine');
    like($m, qr/^kvgate_engine_load_tokens\{engine="a"\} \d+$/m, 'kvgate_engine_load_tokens by engine');
    # every engine's own statistics, labelled by engine, each family described once
    my @pools = grep { $g->engine_metric($m, 'kvgate_kv_pool_blocks', undef, $_) > 0 } qw(a b c s);
    is_deeply(\@pools, [qw(a b c s)], 'kvgate_kv_pool_blocks{engine=...} for each of the four engines');
    my @busy = grep { $g->engine_metric($m, 'kvgate_engine_tokens_total', 'phase="prefill"', $_) > 0 } qw(a b c);
    ok(@busy >= 1, "  prefill tokens counted on the engines that served (@busy)");
    my @help = $m =~ /^# HELP kvgate_kv_blocks /mg;
    is(scalar @help, 1, '  one HELP line for a family of several engines');
    unlike($m, qr/^kvgate_kv_blocks\{state=/m, '  no engine series without its engine label');
}

my ($clean, @bad) = $g->finish(qr/exited on signal 9/);
ok($clean, 'no alerts, crashes or sanitizer reports') or diag(join "\n", @bad);

done_testing;
