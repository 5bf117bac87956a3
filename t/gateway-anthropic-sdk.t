#!/usr/bin/perl
# The official Anthropic SDK for TypeScript/JavaScript (npm package "@anthropic-ai/sdk",
# unmodified, pinned, installed into $BUILD/npm on first use by Kvgate::Npm) against the
# gateway's /v1/messages: messages.create, messages.stream and create({stream: true})
# with their text and usage, a stop sequence, the usage of a repeated long prompt with a
# cache_control breakpoint (cache_read_input_tokens), and the SDK's own error classes
# for Anthropic's error objects (400, 404, 401).
# Fails (a skip the harness refuses) when node or the npm registry is not available.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/lib";

use Cwd qw(abs_path);
use JSON::PP;
use Test::More;
use Kvgate::Engine;
use Kvgate::Gateway;
use Kvgate::Npm;

my $sdk_version = '1.17.0';
my $node = `command -v node 2>/dev/null`;
chomp $node;
plan skip_all => 'node is not installed' unless $node;
my ($npm_dir, $lock, $why) = Kvgate::Npm::install_shared('@anthropic-ai/sdk' => $sdk_version);
plan skip_all => "cannot install \@anthropic-ai/sdk $sdk_version: $why" unless $npm_dir;

my $g = Kvgate::Gateway->new(locations => <<'EOF2');
        location /strict/v1/ {
            kvgate_pass;
            kvgate_tenant_required on;
        }
EOF2

my $doc = join ' ', map { $_->{full_text} } @{ JSON::PP->new->decode(do {
    open my $fh, '<', Kvgate::Engine::shared_dir() . '/models/stories260K/golden-greedy.json' or die $!;
    local $/; <$fh>
})->{cases} }[0 .. 1];
$doc = 'You tell stories. ' . substr($doc, 0, 900);

# Node resolves '@anthropic-ai/sdk' from the script's directory upwards: a copy of the
# script in the install, under a name of this run's own.
my $script = abs_path("$FindBin::Bin/sdk/anthropic-sdk.mjs");
my $copy = "anthropic-sdk-$$.mjs";
system('cp', $script, "$npm_dir/$copy") == 0 or die 'cp';
my $base = $g->t->url('');
$base =~ s{/$}{};
$ENV{KVGATE_BASE_URL} = $base;
$ENV{KVGATE_LONG_SYSTEM} = $doc;
my $json = `cd '$npm_dir' && '$node' '$copy' 2>&1`;
unlink "$npm_dir/$copy";
undef $lock;
my $o = eval { JSON::PP->new->decode($json) };
ok($o, 'the SDK script ran') or diag($json);
$o //= {};

# the same request through the plain HTTP API: what the SDK must have seen
my $ref = $g->post('/v1/messages', { model => 'stories260K', max_tokens => 24, temperature => 0,
                                     messages => [ { role => 'user', content => 'Tell me a story' } ] },
                   'X-Tenant-Id' => 'anthropic-sdk')->{json};
my $want = join '', map { $_->{text} } @{ $ref->{content} };

my $c = $o->{create} // {};
like($c->{id} // '', qr/^msg_/, 'messages.create(): id msg_...');
is($c->{type}, 'message', '  type message');
is($c->{role}, 'assistant', '  role assistant');
is($c->{model}, 'stories260K', '  model');
is($c->{content}[0]{type}, 'text', '  a text block');
is($c->{text}, $want, "  the text ('$want')");
is($c->{stop_reason}, 'max_tokens', '  stop_reason max_tokens');
ok(exists $c->{stop_sequence} && !defined $c->{stop_sequence}, '  stop_sequence null');
is($c->{usage}{output_tokens}, 24, '  usage.output_tokens 24');
is($c->{usage}{input_tokens}, $ref->{usage}{input_tokens}, '  usage.input_tokens');
is($c->{usage}{cache_read_input_tokens}, 0, '  usage.cache_read_input_tokens 0 (a short prompt)');
is($c->{usage}{cache_creation_input_tokens}, 0, '  usage.cache_creation_input_tokens 0');

my $s = $o->{stop} // {};
is($s->{stop_reason}, 'stop_sequence', "stop_sequences ['zzqq', '" . ($s->{word} // '') . "']: stop_reason stop_sequence");
is($s->{stop_sequence}, $s->{word}, '  stop_sequence: the one that matched');
is($s->{text}, substr($want, 0, index($want, $s->{word} // '')), '  the text before it');

my $st = $o->{stream} // {};
is($st->{text}, $want, "messages.stream(): the 'text' events add up to the text");
is($st->{final_text}, $want, '  finalMessage(): the same text');
is($st->{stop_reason}, 'max_tokens', '  stop_reason max_tokens');
is($st->{usage}{output_tokens}, 24, '  usage.output_tokens 24');
is($st->{usage}{input_tokens}, $ref->{usage}{input_tokens}, '  usage.input_tokens');
like($st->{id} // '', qr/^msg_/, '  the message id');

my $rs = $o->{raw_stream} // {};
my $types = join ' ', @{ $rs->{types} // [] };
$types =~ s/(?: content_block_delta)+/ content_block_delta*/;
# (the SDK consumes the ping itself: t/gateway-messages.t sees it on the wire)
is($types, 'message_start content_block_start content_block_delta* content_block_stop message_delta message_stop',
   'create({stream: true}): the events, in order');
is($rs->{text}, $want, '  the text_deltas add up to the text');
is($rs->{start_usage}{input_tokens}, $ref->{usage}{input_tokens}, '  message_start usage.input_tokens');
is($rs->{delta_usage}{output_tokens}, 24, '  message_delta usage.output_tokens');
is($rs->{stop_reason}, 'max_tokens', '  message_delta stop_reason');

my $k = $o->{cache} // {};
my $pt = ($k->{first}{input_tokens} // 0) + ($k->{first}{cache_read_input_tokens} // 0)
         + ($k->{first}{cache_creation_input_tokens} // 0);
my $cached = int(($pt - 1) / 16) * 16;
my $written = $k->{first}{cache_creation_input_tokens} // 0;
ok($pt >= 128, "a $pt-token prompt with a cache_control breakpoint on its system block");
is($k->{first}{cache_read_input_tokens}, 0, '  first: cache_read_input_tokens 0');
ok($written >= 16 && $written % 16 == 0 && $written < $pt,
   "  first: cache_creation_input_tokens $written (the system block's full blocks, now held)");
is($k->{second}{cache_read_input_tokens}, $cached, "  second: cache_read_input_tokens $cached");
is($k->{second}{input_tokens}, $pt - $cached, '  second: input_tokens the rest');
is($k->{second}{cache_creation_input_tokens}, 0, '  second: cache_creation_input_tokens 0 (read, not written)');
is($k->{streamed}{cache_read_input_tokens}, $cached, '  streamed: finalMessage() usage.cache_read_input_tokens');
is($k->{streamed}{input_tokens}, $pt - $cached, '  streamed: usage.input_tokens');
ok($k->{same_text}, '  the same answer, cached or not');

sub sdk_err {
    my ($e, $class, $status, $type, $name, $re) = @_;
    $e //= {};
    is($e->{class}, $class, "$name: $class");
    is($e->{status}, $status, "  status $status");
    is($e->{type}, $type, "  error.type $type");
    like($e->{message} // '', $re, '  message') if $re;
}
sdk_err($o->{err_max_tokens}, 'BadRequestError', 400, 'invalid_request_error', 'no max_tokens', qr/max_tokens/);
sdk_err($o->{err_model}, 'NotFoundError', 404, 'not_found_error', 'an unknown model', qr/claude-sonnet-4-5/);
sdk_err($o->{err_image}, 'BadRequestError', 400, 'invalid_request_error', 'an image block', qr/not supported/);
sdk_err($o->{err_breakpoints}, 'BadRequestError', 400, 'invalid_request_error', '5 cache_control blocks',
        qr/maximum of 4/);
sdk_err($o->{err_ttl}, 'BadRequestError', 400, 'invalid_request_error', 'ttl 2h', qr/'5m' or '1h'/);
sdk_err($o->{err_tenant}, 'AuthenticationError', 401, 'authentication_error', 'no tenant where one is required');
sdk_err($o->{err_stream}, 'BadRequestError', 400, 'invalid_request_error', 'messages.stream() refused',
        qr/max_tokens/);

$g->stop;
done_testing;
