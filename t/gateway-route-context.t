#!/usr/bin/perl
# Engines of one model with different --context in one group: a request goes only to
# an engine with room for its prompt and the max_tokens it asks for, whatever its
# route key prefers; when none has room, the answer is 400 context_length_exceeded.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Test::More;
use Kvgate::Engine;
use Kvgate::Gateway;

my $g = Kvgate::Gateway->new(
    engines => [ { name => 'short', extra => [ '--context', '160' ] }, { name => 'long' } ],
    group => 'route prefix;');

my %ctx = map { $_->{name} => $_->{context_length} } @{ $g->status->{engines} };
is($ctx{short}, 160, 'engine short: 160 tokens of context');
ok(($ctx{long} // 0) > 300, "engine long: $ctx{long}");

sub ask {
    my ($tenant, $prompt, $max) = @_;
    return $g->post('/v1/completions', { model => 'stories260K', prompt => $prompt, max_tokens => $max,
                                         temperature => 0 }, 'X-Tenant-Id' => $tenant);
}

# A prompt of some 200 tokens: only engine long has room. Many tenants, so that the
# route keys of some prefer engine short (both idle: the choice would go by rendezvous).
my $long = join ' ', ('Once upon a time there was a little girl named Lily.') x 16;
my $n = 12;
for my $i (1 .. $n) {
    my $r = ask("w$i", "$long $i", 4);
    is($r->{status}, 200, "tenant w$i, a long prompt: 200") or diag(explain($r->{json}));
}
my @lines = $g->wait_log(qr/^200 t=w\d+ .* e=\w+$/, count => $n);
is(scalar(grep { / e=long$/ } @lines), $n, "all $n went to engine long");

# A short prompt asking for more tokens than engine short has room for.
my $short = 'Once upon a time there was a little girl named Lily.';
for my $i (1 .. 6) {
    my $r = ask("m$i", "$short $i", 200);
    is($r->{status}, 200, "tenant m$i, max_tokens 200: 200");
}
@lines = $g->wait_log(qr/^200 t=m\d+ .* e=\w+$/, count => 6);
is(scalar(grep { / e=long$/ } @lines), 6, '  all went to engine long');

# Short requests may go to either: both are used.
for my $i (1 .. 12) {
    is(ask("s$i", "$short $i", 4)->{status}, 200, "tenant s$i, a short request: 200");
}
@lines = $g->wait_log(qr/^200 t=s\d+ .* e=\w+$/, count => 12);
ok(scalar(grep { / e=short$/ } @lines) > 0, 'short requests reach engine short too (' .
   scalar(grep { / e=short$/ } @lines) . ' of 12)');

# Too long for every engine.
my $r = ask('x', join(' ', ($long) x 4), 4);
is($r->{status}, 400, 'a prompt longer than every context: 400');
is($r->{json}{error}{code}, 'context_length_exceeded', '  context_length_exceeded');

$g->stop;
done_testing;
