#!/usr/bin/perl
# Workers that exit after their kvgate_thread_pool threads tokenized prompts exit cleanly.
#
# A thread that tokenized holds per-thread tokenizer memory whose destructor is code of
# the module (libkvgate inside ngx_http_kvgate_module.so). nginx destroys a worker's
# thread pools and then unloads the modules: a thread still in pthread_exit, running
# that destructor, would execute unmapped code (the worker dies on SIGSEGV, the master
# logs "exited on signal 11"). The module keeps itself loaded in a worker for the
# worker's life so that this cannot happen.
#
# That interleaving is rare on its own (once in some seven runs of the suite), so nginx
# runs with an LD_PRELOAD shim (t/shim/slow_thread_exit.c) that makes it certain: each
# thread's end sleeps before the module's destructors run, and exit() sleeps longer.
# Every round makes many threads tokenize (concurrent requests, min_bytes=0), then
# reloads nginx: the old workers exit through exactly that path. No old worker may die.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time);
use Kvgate::Gateway;

my $THREADS = 8;
my $ROUNDS = 3;

my $shim = Kvgate::Engine::build_dir() . '/t/slow_thread_exit.so';
plan skip_all => "$shim not built (make units)" unless -f $shim;
$ENV{KVGATE_NGINX_PRELOAD} = $shim;

my $g = Kvgate::Gateway->new(main => "thread_pool kvg_many threads=$THREADS max_queue=4096;",
                             locations => <<'EOF');
        location /pool/v1/ {
            kvgate_pass;
            kvgate_thread_pool kvg_many min_bytes=0;
        }
EOF
my $t = $g->t;

# Sends $n requests at once on their own connections; returns how many got a 200.
sub burst {
    my ($n, $round) = @_;
    my (%buf, @socks);
    for my $i (1 .. $n) {
        my $body = encode_json({ model => 'stories260K', max_tokens => 1, temperature => 0,
                                 prompt => "Round $round, request $i: once upon a time " x 3 });
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->port(0),
                                      Proto => 'tcp', Timeout => 5) or die "connect: $!";
        print $s "POST /pool/v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               . "Content-Length: " . length($body) . "\r\nConnection: close\r\n\r\n$body";
        push @socks, $s;
        $buf{$s} = '';
    }
    my $sel = IO::Select->new(@socks);
    my $deadline = time + 60;
    while ($sel->count && time < $deadline) {
        for my $s ($sel->can_read(1)) {
            my $got = sysread($s, my $chunk, 65536);
            if ($got) {
                $buf{$s} .= $chunk;
            } else {
                $sel->remove($s);
                close $s;
            }
        }
    }
    close $_ for $sel->handles;
    return scalar grep { $buf{$_} =~ m{^HTTP/1\.1 200 } } @socks;
}

for my $round (1 .. $ROUNDS) {
    my $ok = burst(2 * $THREADS, $round);
    is($ok, 2 * $THREADS, "round $round: " . (2 * $THREADS) . " prompts tokenized in the pool, all answered");
    $g->reload;
}
my @bad = grep { /exited on signal/ } split /\n/, $t->read_file('logs/error.log');
is_deeply(\@bad, [], "$ROUNDS reloads: no old worker died on its way out") or diag(join "\n", @bad);

$g->stop;
done_testing();
