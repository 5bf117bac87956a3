package Kvgate::LlamaCpp;

# llama.cpp, the reference engine of t/engine-families.t and t/bench/engine: the prebuilt
# library node-llama-cpp ships (npm package @node-llama-cpp/linux-x64, CPU build, one
# libggml-cpu-*.so per ISA level), pinned to the version whose ABI t/bench/llamacpp_api.h
# was checked against, installed on first use into $BUILD/npm by Kvgate::Npm (its lock
# makes parallel prove jobs and the two passes of `make test` safe).
#
#   use Kvgate::LlamaCpp;
#   my ($ref, $why) = Kvgate::LlamaCpp::install();   # undef and why when npm cannot
#   $ref->{lib}    # the folder holding libllama*.so: build/bench/llamacpp_* --lib
#
# While $ref lives its holder keeps $BUILD/npm/.install.lock shared (as
# Kvgate::TokenizerRef's): another test's install waits until the library is unloaded.
# From a shell (t/bench/engine --install-llamacpp):
#   perl -It/lib -MKvgate::LlamaCpp -e 'print Kvgate::LlamaCpp::lib_or_die(), "\n"'

use strict;
use warnings;

use Kvgate::Npm;

our $PACKAGE = '@node-llama-cpp/linux-x64';
our $VERSION_PINNED = '3.22.1';       # llama_version() "0.5.0-dev": see t/bench/llamacpp_api.h

sub lib_dir { return Kvgate::Npm::dir() . "/node_modules/$PACKAGE/bins/linux-x64" }

sub install {
    my ($dir, $lock, $why) = Kvgate::Npm::install_shared($PACKAGE => $VERSION_PINNED);
    return (undef, $why) unless $dir;
    my $lib = lib_dir();
    opendir my $dh, $lib or return (undef, "$PACKAGE\@$VERSION_PINNED installed, but no $lib: $!");
    my @so = grep { /^libllama\.?v?[\d.]*\.so/ && !/^libllama-/ } readdir $dh;
    closedir $dh;
    return (undef, "no libllama*.so in $lib") unless @so;
    return ({ lib => $lib, lock => $lock }, undef);
}

sub lib_or_die {
    my ($ref, $why) = install();
    die "Kvgate::LlamaCpp: $why\n" unless $ref;
    return $ref->{lib};
}

1;
