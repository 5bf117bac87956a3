#!/usr/bin/env perl
# The KV disk tier as the gateway shows it: an engine with --kv-disk behind nginx, a
# prompt evicted from its 19-block pool by two others and asked again (a hit read back
# from disk, the same answer), then /metrics carries the kvgate_kv_disk_* series (slots,
# hit tokens, blocks and bytes each way, seconds, events) and /status the cache's
# "disk" object; `promtool check metrics` accepts the text where promtool is installed.
# The statistics page is rewritten after engine steps: reads wait with a deadline.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use File::Temp qw(tempdir tempfile);
use JSON::PP;
use Test::More;
use Kvgate::Gateway;

my $dir = tempdir('kvgate-gw-kvdisk-XXXXXX', TMPDIR => 1, CLEANUP => 1);
my $g = Kvgate::Gateway->new(engine => ['--kv-memory', '400K', '--kv-disk', "$dir/kv", '--kv-disk-size', '4M']);

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
my $pt = $first->{json}{usage}{prompt_tokens};
my $full = int(($pt - 1) / 16) * 16;
ask(1);
ask(2);
my $again = ask(0);
is($again->{headers}{'x-kvgate-cache'}, 'hit', 'prompt A after B and C evicted it from the pool: hit');
is($again->{json}{usage}{prompt_tokens_details}{cached_tokens}, $full, "  $full cached tokens, from disk");
is($again->{json}{choices}[0]{text}, $first->{json}{choices}[0]{text}, '  the same answer');

my $m = $g->wait_metrics(sub { $g->engine_metric($_[0], 'kvgate_kv_disk_hit_tokens_total') >= $full },
                         'the disk hit in /metrics');
is($g->engine_metric($m, 'kvgate_kv_disk_hit_tokens_total'), $full, "kvgate_kv_disk_hit_tokens_total $full");
is($g->engine_metric($m, 'kvgate_kv_disk_slots', 'state="total"'), 146, 'kvgate_kv_disk_slots{state="total"} 146 (4M of 28K slots)');
ok($g->engine_metric($m, 'kvgate_kv_disk_blocks_total', 'direction="read"') >= $full / 16, '  blocks read');
ok($g->engine_metric($m, 'kvgate_kv_disk_blocks_total', 'direction="write"') > 0
   || $g->engine_metric($m, 'kvgate_kv_disk_slots', 'state="used"') == 0, '  blocks written (or none yet)');
like($m, qr/^kvgate_kv_disk_seconds_total\{engine="[^"]+",direction="read"\} \d+\.\d{6}$/m, '  seconds as a float');
is($g->engine_metric($m, 'kvgate_kv_disk_events_total', 'event="corrupt"'), 0, '  no corrupt block');
is($g->engine_metric($m, 'kvgate_kv_disk_events_total', 'event="io_error"'), 0, '  no I/O error');
is($g->engine_metric($m, 'kvgate_kv_disk_events_total', 'event="expired"'), 0, '  nothing expired (the 5-minute TTL)');
is($g->engine_metric($m, 'kvgate_kv_disk_events_total', 'event="quota_eviction"'), 0, '  no quota eviction (no --tenant-quota)');
is($g->engine_metric($m, 'kvgate_kv_disk_events_total', 'event="staging_full"'), 0, '  no read refused for want of staging');
like($m, qr/^kvgate_kv_disk_reads_in_flight\{engine="[^"]+"\} 0$/m, 'kvgate_kv_disk_reads_in_flight 0: the hit\'s reads are done');
my ($reader) = $m =~ /^kvgate_kv_disk_reader_blocks_total\{engine="[^"]+"\} (\d+)$/m;
ok(defined $reader && $reader <= $g->engine_metric($m, 'kvgate_kv_disk_blocks_total', 'direction="read"'),
   'kvgate_kv_disk_reader_blocks_total ' . ($reader // 'absent') . ': of the blocks read');

my $s = $g->status // {};
is($s->{cache}{disk}{slots_total}, 146, '/status: cache.disk.slots_total');
ok(($s->{cache}{disk}{hit_tokens} // 0) >= $full, '  cache.disk.hit_tokens');
ok(exists $s->{cache}{disk}{expired} && exists $s->{cache}{disk}{quota_evictions},
   '  cache.disk.expired and cache.disk.quota_evictions');
is_deeply([ map { $s->{cache}{disk}{$_} } qw(staging_full reads_in_flight) ], [0, 0],
          '  cache.disk.staging_full and reads_in_flight 0');
ok(defined $s->{cache}{disk}{reader_blocks}, '  cache.disk.reader_blocks');

SKIP: {
    my $promtool = (grep { -x "$_/promtool" } split /:/, $ENV{PATH})[0];
    skip 'no promtool', 1 unless $promtool;
    my ($fh, $f) = tempfile(DIR => $dir);
    print $fh $m;
    close $fh;
    my $out = `$promtool/promtool check metrics < $f 2>&1`;
    is($?, 0, 'promtool check metrics accepts it') or diag($out);
}

$g->stop;
done_testing();
