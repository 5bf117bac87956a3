#!/usr/bin/perl
# The official OpenAI SDK for JavaScript (npm package "openai", installed into
# $BUILD/npm on first use) against the gateway: models, completions and chat, streamed
# and not, n samples with a seed, the X-KVGate headers through withResponse(), and the
# SDK's own error classes for a 404, a 400 with its param, a context overflow and a 422
# (an answer_pattern that ran out of kvgate_answer_pattern_steps).
# Skipped when node or the npm registry is not available.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Cwd qw(abs_path);
use Fcntl qw(:flock);
use JSON::PP;
use Test::More;
use Kvgate::Gateway;

my $sdk_version = '6.49.0';
my $node = `command -v node 2>/dev/null`;
chomp $node;
plan skip_all => 'node is not installed' unless $node;

my $build = $ENV{BUILD} || 'build';
$build = Kvgate::Test::repo_root() . "/$build" unless $build =~ m{^/};
my $npm_dir = "$build/npm";
my $pkg = "$npm_dir/node_modules/openai/package.json";
system('mkdir', '-p', $npm_dir);
# Two runs at once (the plain and the ASan pass of two checkouts' make test, or two
# proves) share $npm_dir: one installs while the other waits.
open my $lock, '>>', "$npm_dir/.install.lock" or die "$npm_dir/.install.lock: $!";
flock $lock, LOCK_EX or die "flock: $!";
my $have = -f $pkg && do { open my $fh, '<', $pkg; local $/; <$fh> =~ /"version":\s*"\Q$sdk_version\E"/ };
unless ($have) {
    my $rc = system("cd '$npm_dir' && npm install --no-audit --no-fund --silent openai\@$sdk_version >npm.log 2>&1");
    plan skip_all => "cannot install the openai npm package ($npm_dir/npm.log)" if $rc != 0 || !-f $pkg;
}
close $lock;

my $g = Kvgate::Gateway->new;
my $script = abs_path("$FindBin::Bin/sdk/openai-sdk.mjs");
# Node resolves 'openai' from the script's directory upwards; point it at our install,
# under a name of this run's own (another run may be copying its own at this moment).
my $copy = "openai-sdk-$$.mjs";
system('cp', $script, "$npm_dir/$copy") == 0 or die 'cp';
my $base = $g->t->url('/v1');
my $json = `cd '$npm_dir' && KVGATE_BASE_URL='$base' '$node' '$copy' 2>&1`;
unlink "$npm_dir/$copy";
my $o = eval { JSON::PP->new->decode($json) };
ok($o, 'the SDK script ran') or diag($json);
$o //= {};

my $golden = JSON::PP->new->decode(do {
    open my $fh, '<', Kvgate::Engine::shared_dir() . '/models/stories260K/golden-greedy.json' or die $!;
    local $/; <$fh>
});
my $c0 = $golden->{cases}[0];
my $want = substr($c0->{full_text}, length $c0->{prompt});

is_deeply($o->{models}, ['stories260K'], 'models.list()');
is($o->{model}, 'stories260K', 'models.retrieve()');
is($o->{completion_text}, $want, 'completions.create(): the reference continuation');
is($o->{completion_object}, 'text_completion', '  a text_completion');
is($o->{completion_usage}{completion_tokens}, 196, '  usage');
is($o->{completion_stream_text}, $want, 'completions.create({stream: true}): the same text, streamed');
is($o->{cache_header}, 'bypass', 'withResponse(): X-KVGate-Cache readable');
is($o->{bucket_header}, 'bypass', '  and X-KVGate-Bucket');
is($o->{chat_role}, 'assistant', 'chat.completions.create(): an assistant message');
ok(length($o->{chat_text} // ''), "  '" . ($o->{chat_text} // '') . "'");
is($o->{chat_finish}, 'length', '  finish_reason length');
is($o->{chat_stream_text}, $o->{chat_text}, 'chat streamed: the same content');
{
    my $k = $o->{cache_key} // {};
    my $pt = $k->{first}{prompt_tokens} // 0;
    ok($pt >= 128, "prompt_cache_key and prompt_cache_retention through the SDK: a $pt-token prompt");
    is($k->{first}{prompt_tokens_details}{cached_tokens}, 0, '  first: nothing cached');
    is($k->{second}{prompt_tokens_details}{cached_tokens}, int(($pt - 1) / 16) * 16, '  second: its full blocks cached');
    ok($k->{same}, '  the same answer');
}
is($o->{chat_stream_usage}{completion_tokens}, 24, '  include_usage: the usage chunk');
is(scalar @{ $o->{n_texts} // [] }, 2, 'n: 2 choices');
is_deeply($o->{n_texts_again}, $o->{n_texts}, '  the same seed, the same choices');
ok($o->{sc} && defined $o->{sc}{samples}, 'kvgate extension through the SDK: the response has its kvgate object');
is(scalar @{ $o->{sc_choices} // [] }, $o->{sc}{samples} // -1, '  one choice per sample drawn');
ok(($o->{sc}{samples} // 0) >= 3 && ($o->{sc}{samples} // 99) <= 6, "  $o->{sc}{samples} of 6 samples drawn (min_samples 3)");
ok(exists $o->{sc}{answer} && ref $o->{sc}{votes} eq 'HASH', '  answer and votes');
is($o->{sc_stream}{samples}, 4, 'streamed chat with a vote: the kvgate chunk reaches the SDK');
is($o->{err_model}{class}, 'NotFoundError', 'an unknown model: the SDK raises NotFoundError');
is($o->{err_model}{code}, 'model_not_found', '  code model_not_found');
is($o->{err_param}{class}, 'BadRequestError', 'temperature 5: BadRequestError');
is($o->{err_param}{param}, 'temperature', '  param temperature');
is($o->{err_context}{code}, 'context_length_exceeded', 'a prompt over the context: context_length_exceeded');
is($o->{err_pattern}{class}, 'UnprocessableEntityError', 'an answer_pattern out of steps: UnprocessableEntityError');
is($o->{err_pattern}{status}, 422, '  status 422');
is($o->{err_pattern}{code}, 'answer_pattern_too_costly', '  code answer_pattern_too_costly');
is($o->{err_pattern}{param}, 'kvgate.answer_pattern', '  param kvgate.answer_pattern');

$g->stop;
done_testing;
