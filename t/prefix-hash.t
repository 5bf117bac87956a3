#!/usr/bin/env perl
# The prefix-hash format, checked from outside: build/bin/kvgate-prefix-hash against
# an independent implementation with Perl's core Digest::SHA (pack "V" = u32le),
# on random model ids, tenants, block sizes and ids; then the CLI's error handling.
# BUILD=<dir> picks another build directory (default: build).
use strict;
use warnings;
use Test::More;
use Digest::SHA qw(sha256 sha256_hex);
use File::Temp qw(tempfile);

my $build = $ENV{BUILD} || 'build';
my $bin = "$build/bin/kvgate-prefix-hash";
ok(-x $bin, "$bin is built") or BAIL_OUT("build it first: make BUILD=$build tools");

sub slurp { my ($f) = @_; open my $fh, '<:raw', $f or die "$f: $!"; local $/; my $s = <$fh>; $s // '' }

# Runs the CLI with $input on stdin; returns (exit status, stdout, stderr).
sub run_cli {
    my ($input, @args) = @_;
    my ($in, $in_name) = tempfile(UNLINK => 1);
    binmode $in;
    print $in $input;
    close $in;
    my (undef, $out_name) = tempfile(UNLINK => 1);
    my (undef, $err_name) = tempfile(UNLINK => 1);
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open STDIN, '<', $in_name or die;
        open STDOUT, '>', $out_name or die;
        open STDERR, '>', $err_name or die;
        exec $bin, @args or exit 127;
    }
    waitpid $pid, 0;
    return ($? >> 8, slurp($out_name), slurp($err_name));
}

# The format, from docs/prefix-hash.md.
sub expected {
    my ($model, $tenant, $bs, @ids) = @_;
    my $h = sha256('kvgate-prefix-v1' . pack('V', length $model) . $model
                   . pack('V', length $tenant) . $tenant);
    my @out = (unpack 'H*', $h);
    for (my $b = 0; ($b + 1) * $bs <= @ids; $b++) {
        $h = sha256($h . pack('V*', @ids[$b * $bs .. ($b + 1) * $bs - 1]));
        push @out, unpack 'H*', $h;
    }
    return join('', map { "$_\n" } @out);
}

srand(20240601);
sub rand_bytes {      # any bytes but NUL (argv cannot carry it), sometimes UTF-8 text
    my ($max) = @_;
    my $n = int(rand($max + 1));
    return join '', map { chr(1 + int(rand(255))) } 1 .. $n if rand() < 0.5;
    return join '', map { ('a' .. 'z', '-', '_', '.', '/', ':')[int(rand(31))] } 1 .. $n;
}

# The worked example of docs/prefix-hash.md.
{
    my ($rc, $out) = run_cli(join("\n", 1 .. 40) . "\n", '--model-id', 'llama-2-7b-chat', '--tenant', 'org_42');
    is($rc, 0, 'worked example: exit 0');
    is($out, expected('llama-2-7b-chat', 'org_42', 16, 1 .. 40), 'worked example: same as Digest::SHA');
    like($out, qr/\Af524f385494ed0ea0b7b164fb4e8dd4f72e5c2e728a538902b343098d6a5e184\n/,
         'worked example: the root printed in the docs');
}

for my $case (1 .. 25) {
    my $model = rand_bytes(40);
    my $tenant = $case % 5 == 0 ? '' : rand_bytes(24);
    my $bs = (1, 2, 3, 7, 16, 16, 16, 32, 64)[int(rand(9))];
    my @ids = map { rand() < 0.1 ? (0, 2147483647)[int(rand(2))] : int(rand(200000)) } 1 .. int(rand(300));
    my $sep = (' ', "\n", "\t", "  \r\n")[int(rand(4))];
    my @args = ('--model-id', $model, '--tenant', $tenant);
    push @args, $case % 3 ? ('--block-size', $bs) : ("--block-size=$bs");
    my ($rc, $out, $err) = run_cli(join($sep, @ids) . (rand() < 0.5 ? "\n" : ''), @args);
    is($rc, 0, "random case $case: exit 0") or diag($err);
    is($out, expected($model, $tenant, $bs, @ids),
       sprintf('random case %d: %d ids, block %d, model %d bytes, tenant %d bytes: matches Digest::SHA',
               $case, scalar @ids, $bs, length $model, length $tenant));
}

{
    my ($rc, $out) = run_cli('', '--model-id', 'm', '--tenant', '');
    is($rc, 0, 'no ids: exit 0');
    is($out, expected('m', '', 16), 'no ids: only the root');
    my ($rc2, $out2) = run_cli(join(' ', 1 .. 16), '--model-id', 'm', '--tenant', 't');
    my ($rc3, $out3) = run_cli(join(' ', 1 .. 31), '--model-id', 'm', '--tenant', 't');
    is($out3, $out2, 'a partial trailing block prints nothing');
    my (undef, $a1) = run_cli('1', '--model-id', 'org_1', '--tenant', '2345');
    my (undef, $a2) = run_cli('1', '--model-id', 'org_12345', '--tenant', '');
    isnt($a1, $a2, '("org_1", "2345") and ("org_12345", "") have different roots');
}

# Errors: exit 1, one line naming the problem, nothing on stdout.
my @bad = (
    [ '1 2 12x 4',           [],                          qr/#3 '12x'/,          'id with letters' ],
    [ '1 -5',                [],                          qr/#2 '-5'/,           'negative id' ],
    [ '2147483648',          [],                          qr/'2147483648'/,      'id above INT32_MAX' ],
    [ '1' . '0' x 40,        [],                          qr/too long/,          'absurdly long id' ],
    [ '1 +2',                [],                          qr/'\+2'/,             'id with a sign' ],
    [ '1 0x10',              [],                          qr/'0x10'/,            'hex id' ],
    [ '1',                   [ '--block-size', '0' ],     qr/block-size '0'/,    'block size 0' ],
    [ '1',                   [ '--block-size', '-4' ],    qr/block-size '-4'/,   'negative block size' ],
    [ '1',                   [ '--block-size', 'abc' ],   qr/block-size 'abc'/,  'non-numeric block size' ],
    [ '1',                   [ '--block-size', '65537' ], qr/block-size '65537'/, 'block size too large' ],
    [ '1',                   [ '--block-size=' ],         qr/block-size ''/,     'empty block size' ],
    [ '1',                   [ '--block-size' ],          qr/needs a value/,     'block size without a value' ],
    [ '1',                   [ '--frobnicate' ],          qr/unknown argument/,  'unknown option' ],
);
for my $t (@bad) {
    my ($input, $extra, $re, $name) = @$t;
    my ($rc, $out, $err) = run_cli($input, '--model-id', 'm', '--tenant', 't', @$extra);
    is($rc, 1, "$name: exit 1");
    like($err, $re, "$name: message") or diag($err);
    is($out, '', "$name: nothing on stdout");
}
{
    my ($rc, $out, $err) = run_cli('1', '--tenant', 't');
    is($rc, 1, 'missing --model-id: exit 1');
    like($err, qr/--model-id and one of --tenant and --default-tenant are required/, 'missing --model-id: message');
    ($rc, $out, $err) = run_cli('1', '--model-id', 'm');
    is($rc, 1, 'missing --tenant: exit 1');
    ($rc, $out, $err) = run_cli('1', '--model-id', 'm', '--tenant', 'a', '--default-tenant', 'a');
    is($rc, 1, 'both --tenant and --default-tenant: exit 1');
    like($err, qr/one of --tenant and --default-tenant/, 'both: message');
}

# The location's default tenant: salted with a 0x00 mark then its name, so it is not
# the tenant a request names with the same string (docs/prefix-hash.md).
{
    my @ids = 1 .. 40;
    my ($rc, $out, $err) = run_cli(join(' ', @ids), '--model-id', 'llama-2-7b-chat', '--default-tenant', 'default');
    is($rc, 0, 'default tenant: exit 0') or diag($err);
    is($out, expected('llama-2-7b-chat', "\0default", 16, @ids), 'default tenant: salt is NUL . name');
    like($out, qr/\A3ced3d920e97f2f005e04a350878f6468759b6a72cdc05f807041adad7309a0f\n/,
         'default tenant: the root printed in the docs');
    my (undef, $named) = run_cli(join(' ', @ids), '--model-id', 'llama-2-7b-chat', '--tenant', 'default');
    isnt($out, $named, 'the default tenant "default" is not the tenant named "default"');
    my (undef, $empty) = run_cli('', '--model-id', 'm', '--default-tenant', '');
    is($empty, expected('m', "\0", 16), 'an empty default name: the mark alone');
    isnt($empty, expected('m', '', 16), '  which is not the empty tenant');
}

done_testing();
