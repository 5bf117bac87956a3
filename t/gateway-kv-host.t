#!/usr/bin/env perl
# The KV host tier as the gateway shows it: the emulated CUDA engine with --kv-host-memory
# behind nginx, a prompt evicted from its 20-block device pool by two others and asked
# again (a hit copied back from host memory, the same answer); then /metrics carries the
# kvgate_kv_host_* series (slots, hit tokens, blocks and bytes each way, seconds, events)
# and /status the cache's "host" object. The statistics page is rewritten after engine
# steps: reads wait with a deadline.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use JSON::PP;
use Test::More;
use Kvgate::Gateway;

my $build = $ENV{BUILD} || 'build';
$build = "$FindBin::Bin/../$build" unless $build =~ m{^/};
my $emu_engine = "$build/emu/bin/kvgate-engine";
ok(-x $emu_engine, "the emulated engine is built ($emu_engine)") or BAIL_OUT('make emu');

# (the emulated device runs a step's kernels on the host, checked: a layer can take seconds on a
# loaded machine, which the stall detector would take for a hung engine)
my $g = Kvgate::Gateway->new(engine_bin => $emu_engine, stall => 'off',
                             engine => ['--backend', 'cuda', '--kv-memory', '200K', '--kv-host-memory', '2M']);
my @cases = @{ JSON::PP->new->decode(do {
    open my $fh, '<', Kvgate::Engine::shared_dir() . '/models/stories260K/golden-greedy.json' or die $!;
    local $/; <$fh>
})->{cases} };
sub ask {
    my ($k) = @_;
    return $g->completion({ prompt => $cases[$k]{full_text}, max_tokens => 24, temperature => 0 },
                          'X-Tenant-Id' => 'acme');
}

my $first = ask(0);
is($first->{headers}{'x-kvgate-cache'}, 'miss', 'prompt A: miss');
my $pt = $first->{json}{usage}{prompt_tokens} // 0;
my $full = int(($pt - 1) / 16) * 16;
ok($full >= 160, "  $pt prompt tokens, $full in full blocks");
ask(1);
ask(2);
my $again = ask(0);
is($again->{headers}{'x-kvgate-cache'}, 'hit', 'prompt A after B and C evicted it from the pool: hit');
is($again->{json}{usage}{prompt_tokens_details}{cached_tokens}, $full, "  $full cached tokens, from host memory");
ok(length($first->{json}{choices}[0]{text} // '') > 0, '  an answer');
is($again->{json}{choices}[0]{text}, $first->{json}{choices}[0]{text}, '  the same answer');

my $m = $g->wait_metrics(sub { $g->engine_metric($_[0], 'kvgate_kv_host_hit_tokens_total') >= $full },
                         'the host hit in /metrics');
is($g->engine_metric($m, 'kvgate_kv_host_hit_tokens_total'), $full, "kvgate_kv_host_hit_tokens_total $full");
is($g->engine_metric($m, 'kvgate_kv_host_slots', 'state="total"'), 204,
   'kvgate_kv_host_slots{state="total"} 204 (2M of 10,240-byte blocks)');
ok($g->engine_metric($m, 'kvgate_kv_host_blocks_total', 'direction="to_device"') >= $full / 16,
   '  blocks copied back to the device');
ok($g->engine_metric($m, 'kvgate_kv_host_blocks_total', 'direction="to_host"') >= $full / 16,
   '  blocks copied to host memory');
is($g->engine_metric($m, 'kvgate_kv_host_bytes_total', 'direction="to_device"'),
   10240 * $g->engine_metric($m, 'kvgate_kv_host_blocks_total', 'direction="to_device"'), '  bytes: 10,240 a block');
like($m, qr/^kvgate_kv_host_seconds_total\{engine="[^"]+"\} \d+\.\d{6}$/m, '  seconds as a float');
is($g->engine_metric($m, 'kvgate_kv_host_events_total', 'event="to_disk"'), 0, '  nothing to disk (no disk tier)');

my $s = $g->status // {};
is($s->{cache}{host}{slots_total}, 204, '/status: cache.host.slots_total');
ok(($s->{cache}{host}{hit_tokens} // 0) >= $full, '  cache.host.hit_tokens');
ok(!exists $s->{cache}{disk}, '  no cache.disk (no disk tier)');

$g->stop;
done_testing();
