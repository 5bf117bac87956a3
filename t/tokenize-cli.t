#!/usr/bin/env perl
# build/bin/kvgate-tokenize from outside: ids for the reference tokenizations and the
# stories260K golden prompts, --decode round trips, the error paths (bad files,
# invalid UTF-8, bad ids, usage), and --chat (chat templates: where they come from,
# the options, the errors). BUILD=<dir> picks another build directory.
use strict;
use warnings;
use Test::More;
use File::Temp qw(tempfile tempdir);
use JSON::PP;

my $build = $ENV{BUILD} || 'build';
my $bin = "$build/bin/kvgate-tokenize";
my $shared = $ENV{KVGATE_SHARED} || '../shared';
ok(-x $bin, "$bin is built") or BAIL_OUT("build it first: make BUILD=$build tools");

my $tok512 = "$shared/models/stories260K/tok512.bin";
my $llama2 = "$shared/tokenizers/llama2/tokenizer.bin";
my $vectors = "$shared/tokenizers/vectors";

sub slurp { my ($f) = @_; open my $fh, '<:raw', $f or die "$f: $!"; local $/; my $s = <$fh>; $s // '' }

sub spew {
    my ($bytes) = @_;
    my ($fh, $name) = tempfile(UNLINK => 1);
    binmode $fh;
    print $fh $bytes;
    close $fh;
    return $name;
}

# Runs the CLI with $input on stdin; returns (exit status, stdout, stderr).
sub run_cli {
    my ($input, @args) = @_;
    my $in_name = spew($input);
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

# ---- golden prompts (BOS + encode) ----
my $golden = JSON::PP->new->decode(slurp("$shared/models/stories260K/golden-greedy.json"));
for my $c (@{ $golden->{cases} }) {
    my $prompt = $c->{prompt};
    utf8::encode($prompt);
    my ($rc, $out, $err) = run_cli($prompt, '--tokenizer', $tok512, '--bos');
    is($rc, 0, "tok512 encodes '$c->{prompt}'") or diag($err);
    is($out, join(' ', @{ $c->{prompt_ids} }) . "\n", "  ids match golden-greedy.json");
}

# ---- reference tokenizations (a sample; the unit tests check them all) ----
for my $vocab ('ggml-vocab-llama-spm.gguf', 'ggml-vocab-gpt-2.gguf') {
    my @inp = split /\n__ggml_vocab_test__\n/, slurp("$vectors/$vocab.inp"), -1;
    pop @inp;                   # after the last separator
    my @out = split /\n/, slurp("$vectors/$vocab.out"), -1;
    is(scalar @inp, 46, "$vocab: 46 test strings");
    for my $i (0, 1, 4, 10, 22, 33, 40) {
        my ($rc, $got, $err) = run_cli($inp[$i], '--tokenizer', "$vectors/$vocab");
        my $want = $out[$i];
        $want =~ s/^\s+//;
        is($got, "$want\n", "$vocab string $i") or diag($err);
    }
}

# ---- --decode round trips ----
my @texts = (
    "Hello world",
    "  leading spaces, trailing spaces  ",
    "line one\nline two\n\n\ttabbed",
    "emoji \xF0\x9F\x98\x80, CJK \xE4\xBD\xA0\xE5\xA5\xBD, combining e\xCC\x81",
    "control \x01\x02\x7f chars",
);
for my $i (0 .. $#texts) {
    my ($rc, $ids, $err) = run_cli($texts[$i], '--tokenizer', $llama2);
    is($rc, 0, "llama2 encodes text $i") or diag($err);
    like($ids, qr/^\d+( \d+)*\n\z/, "  one line of ids");
    my ($rc2, $back, $err2) = run_cli($ids, '--tokenizer', $llama2, '--decode');
    is($rc2, 0, "  decodes") or diag($err2);
    is($back, $texts[$i], "  round trip is exact");
}
{
    my ($rc, $out) = run_cli('', '--tokenizer', $llama2);
    is($out, "\n", 'empty input: an empty line of ids');
    ($rc, $out) = run_cli('', '--tokenizer', $llama2, '--bos');
    is($out, "1\n", 'empty input with --bos: just BOS');
}

# ---- special tokens ----
{
    my $gpt2 = "$vectors/ggml-vocab-gpt-2.gguf";
    my (undef, $plain) = run_cli('<|endoftext|>', '--tokenizer', $gpt2);
    my (undef, $special) = run_cli('<|endoftext|>', '--tokenizer', $gpt2, '--special');
    is($special, "50256\n", '--special turns <|endoftext|> into its id');
    isnt($plain, "50256\n", 'without --special it is plain text');
}

# ---- errors ----
sub fails_like {
    my ($input, $args, $re, $name) = @_;
    my ($rc, $out, $err) = run_cli($input, @$args);
    is($rc, 1, "$name: exit status 1");
    like($err, $re, "$name: message");
}

my $garbage = spew("this is not a tokenizer, just some text that goes on and on\n" x 3);
fails_like('hi', ['--tokenizer', $garbage], qr/\Q$garbage\E: not a tokenizer file/, 'garbage file');
my $truncated_gguf = spew(substr(slurp("$vectors/ggml-vocab-gpt-2.gguf"), 0, 5000));
fails_like('hi', ['--tokenizer', $truncated_gguf], qr/\Q$truncated_gguf\E: .*(truncated|remain)/i,
           'truncated GGUF');
my $truncated_bin = spew(substr(slurp($tok512), 0, 3001));
fails_like('hi', ['--tokenizer', $truncated_bin], qr/\Q$truncated_bin\E: truncated llama2\.c tokenizer/,
           'truncated tokenizer.bin');
my $bad_json = spew('{"model": {"type": "BPE", "vocab": ');
fails_like('hi', ['--tokenizer', $bad_json], qr/\Q$bad_json\E: /, 'truncated tokenizer.json');
my $empty = spew('');
fails_like('hi', ['--tokenizer', $empty], qr/\Q$empty\E: empty file/, 'empty file');
fails_like('hi', ['--tokenizer', '/nonexistent/tok.bin'], qr{/nonexistent/tok\.bin: cannot open},
           'missing file');
fails_like("ok \xC3\x28 bad", ['--tokenizer', $tok512], qr/invalid UTF-8 at byte offset 3/, 'invalid UTF-8');
fails_like("1 2 99999", ['--tokenizer', $tok512, '--decode'], qr/token id 99999 .*out of range/, 'bad id');
fails_like("1 two 3", ['--tokenizer', $tok512, '--decode'], qr/'two' at byte offset 2/, 'non-numeric id');

# ---- --chat: a request rendered with a chat template ----
# (t/chat-templates.t compares the rendering with the reference on real templates; here:
# where the template comes from, the options, and the errors)
{
    my $dir = File::Temp::tempdir(CLEANUP => 1);
    sub put { my ($f, $s) = @_; open my $fh, '>:raw', $f or die "$f: $!"; print $fh $s; close $fh; $f }
    my $conv = put("$dir/conv.json", '[{"role":"developer","content":"be brief"},'
                   . '{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]');
    my $show = put("$dir/show.jinja", "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}\n"
                   . "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}{{ eos_token }}");
    my ($rc, $out, $err) = run_cli('', '--chat', $conv, '--template', $show, '--text');
    is($rc, 0, '--chat --template --text') or diag($err);
    is($out, "[system]be brief\n[user]a\nb\n", '  developer -> system, parts joined; no BOS/EOS text without a model');
    ($rc, $out) = run_cli('', '--chat', $conv, '--template', $show, '--text', '--add-generation-prompt',
                          '--bos-token', '<B>', '--eos-token', '<E>');
    is($out, "<B>[system]be brief\n[user]a\nb\n[assistant]<E>", '  --add-generation-prompt, --bos-token, --eos-token');

    # the request as an object, with tools and kwargs; --tools and --template-kwargs replace them
    my $obj = put("$dir/obj.json", '{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function",'
                  . '"function":{"name":"f"}}],"chat_template_kwargs":{"flag":"file"}}');
    my $vars = put("$dir/vars.jinja", "{{ tools | length }} {{ tools[0].function.name }} {{ flag }}");
    ($rc, $out, $err) = run_cli('', '--chat', $obj, '--template', $vars, '--text');
    is($out, "1 f file", '--chat FILE as an object: tools and chat_template_kwargs') or diag($err);
    my $tools = put("$dir/tools.json", '[{"type":"function","function":{"name":"g"}},{"type":"function","function":{"name":"h"}}]');
    ($rc, $out, $err) = run_cli('', '--chat', $obj, '--template', $vars, '--text', '--tools', $tools,
                                '--template-kwargs', '{"flag":"option"}');
    is($out, "2 g option", '  --tools and --template-kwargs replace the file\'s') or diag($err);

    # where the template comes from: a model directory, its tokenizer.json, a GGUF
    my $model = "$dir/model";
    mkdir $model or die;
    put("$model/tokenizer.json", '{}');
    put("$model/tokenizer_config.json", '{"bos_token":{"content":"<|B|>","lstrip":false},"eos_token":"<|E|>",'
        . '"chat_template":[{"name":"tool_use","template":"T"},{"name":"default","template":'
        . '"D{{ bos_token }}{{ messages[1].content }}{{ eos_token }}"}]}');
    ($rc, $out, $err) = run_cli('', '--chat', $conv, '--tokenizer', $model, '--text');
    is($out, "D<|B|>a\nb<|E|>", 'a model directory: tokenizer_config.json\'s "default" template, its bos/eos tokens')
        or diag($err);
    ($rc, $out, $err) = run_cli('', '--chat', $conv, '--tokenizer', "$model/tokenizer.json", '--text', '--eos-token', '!');
    is($out, "D<|B|>a\nb!", '  the same beside a tokenizer.json; --eos-token wins') or diag($err);
    put("$model/chat_template.jinja", "J{{ messages | length }}");
    ($rc, $out, $err) = run_cli('', '--chat', $conv, '--tokenizer', $model, '--text');
    is($out, 'J2', '  chat_template.jinja wins over tokenizer_config.json') or diag($err);
    put("$model/tokenizer_config.json", '{"chat_template":[{"name":"rag","template":"R"}]}');
    unlink "$model/chat_template.jinja";
    ($rc, undef, $err) = run_cli('', '--chat', $conv, '--tokenizer', $model, '--text');
    is($rc, 1, '  a list of templates without "default": exit status 1');
    like($err, qr/without one named "default"/, '  saying so');
    put("$model/tokenizer_config.json", '{}');
    ($rc, undef, $err) = run_cli('', '--chat', $conv, '--tokenizer', $model, '--text');
    like($err, qr/\Q$model\E: no chat template/, '  no template at all: said');

    # a minimal GGUF: the template and the BOS/EOS pieces from its metadata
    my $gstr = sub { pack('Q<', length $_[0]) . $_[0] };
    my $gguf = 'GGUF' . pack('L<Q<Q<', 3, 0, 4)
        . $gstr->('tokenizer.chat_template') . pack('L<', 8)
        . $gstr->('{{ bos_token }}{{ messages[0].content }}{{ eos_token }}')
        . $gstr->('tokenizer.ggml.tokens') . pack('L<L<Q<', 9, 8, 3) . join('', map { $gstr->($_) } '<unk>', '<s>', '</s>')
        . $gstr->('tokenizer.ggml.bos_token_id') . pack('L<L<', 4, 1)
        . $gstr->('tokenizer.ggml.eos_token_id') . pack('L<L<', 4, 2);
    $gguf .= "\0" x ((32 - length($gguf) % 32) % 32);
    my $gfile = put("$dir/model.gguf", $gguf);
    ($rc, $out, $err) = run_cli('', '--chat', $conv, '--tokenizer', $gfile, '--text');
    is($out, '<s>be brief</s>', 'a GGUF: tokenizer.chat_template, BOS/EOS pieces by id') or diag($err);
    ($rc, undef, $err) = run_cli('', '--chat', $conv, '--tokenizer', "$vectors/ggml-vocab-gpt-2.gguf", '--text');
    like($err, qr/no chat template \(the GGUF has no tokenizer\.chat_template\)/, 'a GGUF without one: said');
    ($rc, undef, $err) = run_cli('', '--chat', $conv, '--tokenizer', $tok512, '--text');
    like($err, qr/no chat template .*llama2\.c tokenizer carries none/, 'a tokenizer.bin: none');

    # ids: the rendered text encoded with special tokens outside the data; no BOS added
    my $eot = put("$dir/eot.jinja", "{% for m in messages %}{{ m.content }}<|endoftext|>{% endfor %}");
    my $says = put("$dir/says.json", '[{"role":"user","content":"hi <|endoftext|>"}]');
    ($rc, $out, $err) = run_cli('', '--chat', $says, '--template', $eot, '--tokenizer', "$vectors/ggml-vocab-gpt-2.gguf");
    is($rc, 0, '--chat without --text: ids') or diag($err);
    my (undef, $plain) = run_cli('hi <|endoftext|>', '--tokenizer', "$vectors/ggml-vocab-gpt-2.gguf");
    chomp $plain;
    is($out, "$plain 50256\n", '  the user\'s <|endoftext|> is text, the template\'s the special token');

    # strftime_now's clock, and a template that raises
    my $date = put("$dir/date.jinja", "{{ strftime_now('%Y-%m-%d %H:%M') }}");
    {
        local $ENV{KVGATE_TEMPLATE_NOW} = 86400 * 365 + 3600;
        local $ENV{TZ} = 'UTC';
        ($rc, $out, $err) = run_cli('', '--chat', $conv, '--template', $date, '--text');
        is($out, '1971-01-01 01:00', 'KVGATE_TEMPLATE_NOW fixes strftime_now') or diag($err);
    }
    my $raise = put("$dir/raise.jinja", "ok{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}");
    ($rc, $out, $err) = run_cli('', '--chat', $conv, '--template', $raise, '--text');
    is($rc, 1, 'a template that raises: exit status 1');
    like($err, qr/System role not supported/, '  its message on stderr');
    is($out, '', '  nothing on stdout');
    my $broken = put("$dir/broken.jinja", "{% for m in messages %}");
    ($rc, undef, $err) = run_cli('', '--chat', $conv, '--template', $broken, '--text');
    is($rc, 1, 'a template that does not compile: exit status 1');
    like($err, qr/\Q$broken\E:\d+:\d+: /, '  NAME:LINE:COL: message');

    # the request is checked as the API checks it
    my $bad = put("$dir/bad.json", '[{"role":"user","content":"x"},{"role":"assistant","tool_calls":'
                  . '[{"id":"c","type":"function","function":{"name":"f","arguments":"{oops"}}]}]');
    ($rc, undef, $err) = run_cli('', '--chat', $bad, '--template', $show, '--text');
    is($rc, 1, 'an invalid request: exit status 1');
    like($err, qr/messages\[1\]\.tool_calls\[0\]\.function\.arguments.*not valid JSON/, '  the param path and why');
    my $notjson = put("$dir/notjson.json", '[{"role":');
    ($rc, undef, $err) = run_cli('', '--chat', $notjson, '--template', $show, '--text');
    like($err, qr/--chat \Q$notjson\E:1:\d+: /, 'a --chat file that is not JSON: said, with its place');

    # usage
    ($rc, undef, $err) = run_cli('', '--chat', $conv, '--text');
    is($rc, 2, '--chat without --template or --tokenizer: exit status 2');
    like($err, qr/--chat needs --template FILE or --tokenizer MODEL/, '  message');
    ($rc, undef, $err) = run_cli('', '--chat', $conv, '--template', $show);
    is($rc, 2, 'ids without a tokenizer: exit status 2');
    like($err, qr/token ids need --tokenizer/, '  message');
    ($rc, undef, $err) = run_cli('', '--template', $show, '--text');
    is($rc, 2, '--template without --chat: exit status 2');
    ($rc, undef, $err) = run_cli('', '--chat', $conv, '--template', $show, '--text', '--bos');
    is($rc, 2, '--bos with --chat: exit status 2 (the template renders BOS)');

    # --chat-batch: many runs in one process, each as its command line alone would be
    my $accents = put("$dir/accents.json", '[{"role":"user","content":"d\u00e9j\u00e0 vu \u2014 \ud83d\ude00"}]');
    my @jobs = (
        ['--chat', $conv, '--template', $show, '--text'],
        ['--chat', $conv, '--template', $show, '--text', '--add-generation-prompt', '--bos-token', '<B>',
         '--eos-token', '<E>'],
        ['--chat', $obj, '--template', $vars, '--text', '--tools', $tools, '--template-kwargs', '{"flag":"option"}'],
        ['--chat', $accents, '--template', $show, '--text'],
        ['--chat', $says, '--template', $eot, '--tokenizer', "$vectors/ggml-vocab-gpt-2.gguf"],
        ['--chat', $conv, '--tokenizer', $gfile, '--text'],
        ['--chat', $conv, '--template', $raise, '--text'],
        ['--chat', $conv, '--template', $broken, '--text'],
        ['--chat', $bad, '--template', $show, '--text'],
        ['--chat', $conv, '--text'],
        ['--chat', $conv, '--template', $show, '--text', '--bogus'],
        ['--chat', $conv, '--template', $show, '--text', '--lines'],
    );
    my $jobs = put("$dir/jobs.json", JSON::PP->new->encode(\@jobs));
    ($rc, $out, $err) = run_cli('', '--chat-batch', $jobs);
    is($rc, 0, '--chat-batch: exit status 0') or diag($err);
    my $res = eval { JSON::PP->new->utf8->decode($out) } || [];
    is(scalar @$res, scalar @jobs, '  one result per job');
    my $same = 0;
    for my $i (0 .. $#jobs) {
        my ($rc1, $out1, $err1) = run_cli('', @{ $jobs[$i] });
        my ($rc2, $out2, $err2) = @{ $res->[$i] // {} }{qw(rc out err)};
        utf8::encode($out2) if defined $out2;
        utf8::encode($err2) if defined $err2;
        # a usage error (2) prints the usage after its message when run alone
        $err1 =~ s/usage: kvgate-tokenize .*//s if $rc1 == 2;
        if (($rc2 // -1) == $rc1 && ($out2 // '') eq $out1 && ($err2 // '') eq $err1) {
            $same++;
        } else {
            diag("job $i (@{ $jobs[$i] }): alone rc $rc1 out '$out1' err '$err1'; "
                 . "in the batch rc @{[ $rc2 // 'none' ]} out '@{[ $out2 // '' ]}' err '@{[ $err2 // '' ]}'");
        }
    }
    is($same, scalar @jobs, '  each job\'s exit status, output and error exactly those of its command line alone '
       . '(text, UTF-8 text, ids, a GGUF, raise, a broken template, a bad request, usage errors)');
    like($res->[3]{out} // '', qr/d\x{e9}j\x{e0} vu \x{2014} \x{1f600}/, '  UTF-8 text stays itself');
    my $notlist = put("$dir/notlist.json", '{"jobs":[]}');
    ($rc, undef, $err) = run_cli('', '--chat-batch', $notlist);
    ok($rc == 1 && $err =~ /not a JSON array of jobs/, '--chat-batch with an object: exit 1, said') or diag($err);
    ($rc, undef, $err) = run_cli('', '--chat-batch', $notjson);
    ok($rc == 1 && $err =~ /--chat-batch \Q$notjson\E:1:\d+: /, '  a file that is not JSON: exit 1, its place')
        or diag($err);
    my $badjob = put("$dir/badjob.json", '[["--chat"], "--text"]');
    ($rc, undef, $err) = run_cli('', '--chat-batch', $badjob);
    ok($rc == 1 && $err =~ /job 2 is not an array of arguments/, '  a job that is not an array: exit 1, said')
        or diag($err);
    my $badarg = put("$dir/badarg.json", '[["--chat", 7]]');
    ($rc, $out, $err) = run_cli('', '--chat-batch', $badarg);
    $res = eval { JSON::PP->new->utf8->decode($out) } || [];
    ok($rc == 0 && ($res->[0]{rc} // 0) == 2 && ($res->[0]{err} // '') =~ /argument 2 is not a string/,
       '  an argument that is not a string: that job fails with 2, said') or diag($out, $err);
    ($rc, undef, $err) = run_cli('', '--chat-batch', $jobs, '--text');
    ok($rc == 2 && $err =~ /takes its options from its file/, '  other options beside it: exit 2') or diag($err);
}

{
    my ($rc, $out) = run_cli('', '--help');
    is($rc, 0, '--help exits 0');
    like($out, qr/usage: kvgate-tokenize --tokenizer FILE/, '--help prints usage');
    like($out, qr/kvgate-tokenize --chat MESSAGES\.json/, '  with --chat');
    ($rc, undef, my $err) = run_cli('', '--bogus');
    is($rc, 2, 'unknown option: exit status 2');
    like($err, qr/unknown or incomplete option '--bogus'/, 'unknown option: message');
    ($rc, undef, $err) = run_cli('');
    is($rc, 2, 'no --tokenizer: exit status 2');
}

done_testing();
