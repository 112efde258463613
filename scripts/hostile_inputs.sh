#!/usr/bin/env bash
# Hostile and careless inputs for the `mambacpp` CLI (issue 20): every case runs with a time limit and an
# address-space limit and records its exit code, signal, time, peak memory and the first line of stderr.
#
#   scripts/hostile_inputs.sh [BINARY] [WORKDIR]     (defaults: build/mambacpp, /tmp/hostile)
#
# Output: WORKDIR/results.tsv (one row a case) and a summary of the cases that are findings: a signal, a time-out, an
# exit code other than 1 for an input that is wrong, or exit 1 with no message. Cases whose input is valid (marked
# "ok" in the table) must exit 0; "any": exit 0 or 1; "slow": a long legitimate job, the time-out expected. Environment: HOSTILE_TIMEOUT (s, default 20), HOSTILE_VMEM_KB (default 4 GiB),
# HOSTILE_FILTER (a grep pattern over case names).
set -u
BIN=$(realpath "${1:-build/mambacpp}")
WORK=${2:-/tmp/hostile}
ROOT=${HOSTILE_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
TIMEOUT=${HOSTILE_TIMEOUT:-20}
VMEM_KB=${HOSTILE_VMEM_KB:-4194304}
FILTER=${HOSTILE_FILTER:-.}
export OMP_WAIT_POLICY=PASSIVE
mkdir -p "$WORK"
cd "$WORK" || exit 2
RESULTS=$WORK/results.tsv
printf 'case\texpect\trc\tsignal\tseconds\tpeak_kb\tmessage\n' >"$RESULTS"

HY=$ROOT/fixtures/hybrid
NEMO=$HY/nemotron_h_f32
BAMBA=$HY/bamba_f32
GRANITE=$HY/granite_h_f32
TOK_N="$NEMO/tokens.txt"

# run NAME EXPECT CMD...   EXPECT: err (a refused input: exit 1 with a message) or ok (exit 0)
run() {
  local name=$1 expect=$2
  shift 2
  echo "$name" | grep -qE -- "$FILTER" || return 0
  # the subcommand shorthands below (gen, b, l, p, s) become the binary's command line
  case $1 in
    gen) shift; set -- "$BIN" generate --device cpu -t 1 --temp 0 -n 2 "$@" ;;
    b) shift; set -- "$BIN" bench --device cpu -t 1 -r 1 "$@" ;;
    l) shift; set -- "$BIN" logits --device cpu -t 1 "$@" ;;
    p) shift; set -- "$BIN" perplexity --device cpu -t 1 "$@" ;;
    s) shift; set -- "$BIN" serve --device cpu -t 1 "$@" ;;
  esac
  local t0 t1 rc sig=- peak msg
  t0=$(date +%s.%N)
  (ulimit -v "$VMEM_KB"; exec /usr/bin/time -f '%M' -o "$WORK/.time" timeout -s KILL "$TIMEOUT" "$@") \
    >"$WORK/.out" 2>"$WORK/.err" </dev/null
  rc=$?
  t1=$(date +%s.%N)
  peak=$(tail -1 "$WORK/.time" 2>/dev/null | grep -E '^[0-9]+$' || echo -)
  grep -q 'Command terminated by signal' "$WORK/.time" 2>/dev/null &&
    sig=$(grep -o 'signal [0-9]*' "$WORK/.time" | head -1 | cut -d' ' -f2)
  [ "$rc" -gt 128 ] && [ "$sig" = - ] && sig=$((rc - 128))
  # the error line where there is one (generate prints its statistics first), else the first line
  msg=$( (grep -a '^error' "$WORK/.err" || grep -av '^Run with --help' "$WORK/.err" | grep -av '^$' | grep -av '^serve: loading') |
    head -1 | tr '\t' ' ' | cut -c1-300)
  printf '%s\t%s\t%s\t%s\t%.2f\t%s\t%s\n' "$name" "$expect" "$rc" "$sig" "$(echo "$t1 - $t0" | bc)" "$peak" "$msg" >>"$RESULTS"
}

# cfg NAME BASE_DIR JQ_FILTER: a copy of a fixture model directory whose config.json is the filter's output
cfg() {
  local name=$1 base=$2 filter=$3
  rm -rf "cfg_$name"
  mkdir -p "cfg_$name"
  ln -s "$base/model.safetensors" "cfg_$name/model.safetensors"
  jq "$filter" "$base/config.json" >"cfg_$name/config.json"
}
# cfg_raw NAME BASE_DIR TEXT: config.json given whole
cfg_raw() {
  rm -rf "cfg_$1"
  mkdir -p "cfg_$1"
  ln -s "$2/model.safetensors" "cfg_$1/model.safetensors"
  printf '%s' "$3" >"cfg_$1/config.json"
}

# ---- options of every subcommand -------------------------------------------------------------------------------
for v in -1 abc nan 1e3 "" 99999999999999999999; do
  run "ctx_size=$v" err gen -m "$NEMO" --tokens-file "$TOK_N" --ctx-size "$v"
done
run "ctx_size_below_prompt" err gen -m "$NEMO" --tokens-file "$TOK_N" --ctx-size 3
run "ctx_size_huge" any gen -m "$NEMO" --tokens-file "$TOK_N" --ctx-size 1000000000000
run "ctx_size_int64_max" any gen -m "$NEMO" --tokens-file "$TOK_N" --ctx-size 9223372036854775807
run "ctx_size_generation_past_it" err "$BIN" generate --device cpu -t 1 -m "$NEMO" --tokens-file "$TOK_N" --ctx-size 50 -n 100
run "ctx_size_pure_model_ok" ok "$BIN" generate --device cpu -t 1 -n 2 -p hi --ctx-size 5
for v in 0 -1 nan 1e3 99999999999999999999; do
  run "batch_tokens=$v" err gen -m "$NEMO" --tokens-file "$TOK_N" --batch-tokens "$v"
done
run "batch_tokens_int64_max" any gen -m "$NEMO" --tokens-file "$TOK_N" --batch-tokens 9223372036854775807
run "batch_tokens_huge_ok" ok gen -m "$NEMO" --tokens-file "$TOK_N" --batch-tokens 1000000000
for v in bogus "" FAST; do run "precision=$v" err gen -m "$NEMO" --tokens-file "$TOK_N" --precision "$v"; done
run "precision_exact_cpu_ok" ok gen -m "$NEMO" --tokens-file "$TOK_N" --precision exact --no-batch-invariant
for v in bogus f16 ""; do run "state_dtype=$v" err gen -m "$NEMO" --tokens-file "$TOK_N" --state-dtype "$v"; done
run "state_dtype_bf16_hybrid_ok" ok gen -m "$NEMO" --tokens-file "$TOK_N" --state-dtype bf16
for v in 1025 -1 100000 nan; do run "threads=$v" err gen -m "$NEMO" --tokens-file "$TOK_N" --threads "$v"; done
for v in -1 2147483648 1e9 nan; do run "n_predict=$v" err "$BIN" generate --device cpu -t 1 -m "$NEMO" --tokens-file "$TOK_N" -n "$v"; done
for v in -1 2147483648 nan; do run "top_k=$v" err gen -m "$NEMO" --tokens-file "$TOK_N" --top-k "$v"; done
for v in -1 2 nan inf; do run "top_p=$v" err gen -m "$NEMO" --tokens-file "$TOK_N" --top-p "$v"; done
for v in -1 nan inf 1e7; do run "temp=$v" err gen -m "$NEMO" --tokens-file "$TOK_N" --temp "$v"; done
for v in 0 nan -1 1e9; do run "repeat_penalty=$v" err gen -m "$NEMO" --tokens-file "$TOK_N" --repeat-penalty "$v"; done
for v in -1 2147483648; do run "repeat_last_n=$v" err gen -m "$NEMO" --tokens-file "$TOK_N" --repeat-last-n "$v"; done
for v in -1 18446744073709551616 abc; do run "seed=$v" err gen -m "$NEMO" --tokens-file "$TOK_N" --seed "$v"; done
for v in 0 -1; do run "max_prompt=$v" err gen -m "$NEMO" --tokens-file "$TOK_N" --max-prompt "$v"; done
run "max_prompt_below_prompt" err gen -m "$NEMO" --tokens-file "$TOK_N" --max-prompt 3
for v in -1 99999999999999999999; do run "max_seqs=$v" err gen -m "$NEMO" --tokens-file "$TOK_N" --max-seqs "$v"; done
for v in -1 9223372036854775807 99999999999999999999 nan; do run "state_cache_mb=$v" err gen -m "$NEMO" --tokens-file "$TOK_N" --state-cache-mb "$v"; done
run "state_cache_mb_huge_ok" ok gen -m "$NEMO" --tokens-file "$TOK_N" --state-cache-mb 1000000000
for v in -1 nan; do run "checkpoint_interval=$v" err gen -m "$NEMO" --tokens-file "$TOK_N" --state-checkpoint-interval "$v"; done
run "checkpoint_interval_1_ok" ok gen -m "$NEMO" --tokens-file "$TOK_N" --state-checkpoint-interval 1
run "checkpoint_interval_past_int32" err gen -m "$NEMO" --tokens-file "$TOK_N" --state-checkpoint-interval 9223372036854775807
run "stop_string_without_tokenizer" err gen -m "$NEMO" --tokens-file "$TOK_N" --stop ""
run "device=bogus" err gen -m "$NEMO" --tokens-file "$TOK_N" --device bogus
run "model_missing" err gen -m /nonexistent --tokens-file "$TOK_N"
run "model_is_a_file" err gen -m "$NEMO/config.json" --tokens-file "$TOK_N"
run "no_input" err gen -m "$NEMO"
run "two_inputs" err gen -m "$NEMO" --tokens-file "$TOK_N" -p x

# bench
run "bench_shape=bogus" err b --shape bogus
run "bench_shape_empty" any b --shape "" -m "$NEMO" -g 1
run "bench_weights=bogus" err b -m "$NEMO" --weights bogus
run "bench_weights_without_shape" err b -m "$NEMO" --weights f32 -g 1 -p 4
SHAPES=$("$BIN" bench --help | grep -o 'real shape: [^ ]*' | cut -d' ' -f3 | tr '|' ' ')
run "bench_shape_and_model" err b --shape "${SHAPES%% *}" -m "$NEMO"
for s in $SHAPES; do
  run "bench_shape_${s}_fp32" any b --shape "$s" --weights f32 -p 1 -g 1
done
for v in 0 -1 1000000000 9223372036854775807; do run "bench_batch=$v" err b -m "$NEMO" -b "$v" -p 4 -g 1; done
for v in 0 -1 1000000000000 9223372036854775807; do run "bench_prompt=$v" err b -m "$NEMO" -p "$v" -g 1; done
run "bench_prompt_past_ctx" err b -m "$BAMBA" -p 5000 -g 1
run "bench_prompt_plus_gen_past_ctx" err b -m "$BAMBA" -p 4000 -g 200
run "bench_gen_int32_max" slow b -m "$NEMO" -p 4 -g 2147483647
for v in -1 9223372036854775807; do run "bench_gen=$v" err b -m "$NEMO" -p 4 -g "$v"; done
for v in 0 -1 2147483648; do run "bench_repeat=$v" err b -m "$NEMO" -p 4 -g 1 -r "$v"; done
run "bench_serve_requests_huge" err b -m "$NEMO" --serve --requests 1000000000000 -g 1
run "bench_serve_min_gt_max" err b -m "$NEMO" --serve --min-prompt 10 --max-prompt 5
run "bench_serve_max_prompt_huge" err b -m "$NEMO" --serve --requests 2 --min-prompt 1 --max-prompt 1000000000000 -g 1
run "bench_serve_max_seqs_huge" err b -m "$NEMO" --serve --requests 2 --max-seqs 1000000000000 -g 1
run "bench_serve_and_chat_turn" err b -m "$NEMO" --serve --chat-turn
run "bench_chat_turn_prompt_huge" err b -m "$NEMO" --chat-turn -p 1000000000000 -g 1
run "bench_chat_turn_past_ctx" err b -m "$BAMBA" --chat-turn -p 4090 -g 100
run "bench_serve_ok" ok b -m "$NEMO" --serve --requests 3 --min-prompt 2 --max-prompt 8 -g 2 --max-seqs 2
run "bench_chat_turn_ok" ok b -m "$NEMO" --chat-turn -p 8 -g 2

# logits
run "logits_chunks_zero" err l -m "$NEMO" --tokens-file "$TOK_N" --chunks 0 -o out.npy
run "logits_chunks_overflow" err l -m "$NEMO" --tokens-file "$TOK_N" --chunks 99999999999999999999 -o out.npy
run "logits_chunks_sum_overflow" err l -m "$NEMO" --tokens-file "$TOK_N" --chunks 9223372036854775807,9223372036854775807,2 -o out.npy
run "logits_chunks_empty_entry" err l -m "$NEMO" --tokens-file "$TOK_N" --chunks 1,,2 -o out.npy
run "logits_chunks_trailing_comma" err l -m "$NEMO" --tokens-file "$TOK_N" --chunks 1,2, -o out.npy
run "logits_chunks_spaces" err l -m "$NEMO" --tokens-file "$TOK_N" --chunks " 1, 2" -o out.npy
for v in 0 -1 9223372036854775807; do run "logits_max_out_mb=$v" err l -m "$NEMO" --tokens-file "$TOK_N" --max-out-mb "$v" -o out.npy; done
run "logits_out_is_dir" err l -m "$NEMO" --tokens-file "$TOK_N" -o /tmp
run "logits_out_unwritable" err l -m "$NEMO" --tokens-file "$TOK_N" -o /nonexistent/x.npy
run "logits_past_ctx" err l -m "$NEMO" --tokens-file "$TOK_N" --ctx-size 4 -o out.npy

# perplexity
printf '' >empty.txt
run "ppl_empty_file" err p -f empty.txt
run "ppl_file_is_dir" err p -f /tmp
for v in -1 1 nan; do run "ppl_context=$v" err p -f "$ROOT/README.md" -c "$v"; done
run "ppl_hybrid_no_tokenizer" err p -m "$NEMO" -f "$ROOT/README.md"

# serve: options refused before the server listens (a valid set would serve forever, so none is run here)
for v in 0 -1 1000000000; do run "serve_parallel=$v" err s --parallel "$v"; done
for v in -1 65536 70000 abc; do run "serve_port=$v" err s --port "$v"; done
for v in -1 1000000; do run "serve_max_queue=$v" err s --max-queue "$v"; done
for v in 0 -1 1000000; do run "serve_max_body_mb=$v" err s --max-body-mb "$v"; done
for v in -1 5000; do run "serve_http_threads=$v" err s --http-threads "$v"; done
for v in 0 -1; do run "serve_max_prompt=$v" err s --max-prompt "$v"; done
for v in -1 4294967297; do run "serve_max_tokens=$v" err s --max-tokens "$v"; done
run "serve_host_bogus" err s --host 999.1.1.1 --port 0
run "serve_chat_template_missing" err s --chat-template /nonexistent.jinja
run "serve_shape_bogus" err s --shape bogus
run "serve_ctx_size_negative" err s -m "$NEMO" --ctx-size -1

# ---- token and prompt files -------------------------------------------------------------------------------------
printf '1,,2' >tok_empty_entry; printf '1 -2 3' >tok_negative; printf '1 2147483648' >tok_overflow
printf '1 200' >tok_past_vocab; printf '' >tok_empty; printf ' \n\t ' >tok_blank; printf '1\x002' >tok_nul
printf '\xef\xbc\x91 2' >tok_fullwidth_digit; printf '1e3' >tok_exponent; printf '0x10' >tok_hex
head -c 100000 /dev/urandom >tok_random
python3 -c "print(' '.join(['1'] * 5000000))" >tok_5m
for f in tok_empty_entry tok_negative tok_overflow tok_past_vocab tok_empty tok_blank tok_nul tok_fullwidth_digit \
  tok_exponent tok_hex tok_random; do
  run "tokens_file_$f" err gen -m "$NEMO" --tokens-file "$f"
done
run "tokens_file_5m_tokens" err gen -m "$NEMO" --tokens-file tok_5m
run "tokens_file_5m_tokens_past_ctx_logits" err l -m "$NEMO" --tokens-file tok_5m -o out.npy
run "tokens_file_is_dir" err gen -m "$NEMO" --tokens-file /tmp
run "tokens_file_missing" err gen -m "$NEMO" --tokens-file /nonexistent
printf '' >prompts_empty; printf '\n\n\n' >prompts_blank
python3 -c "print('\n'.join(['hello'] * 20000))" >prompts_20k
python3 -c "import sys; sys.stdout.buffer.write(b'\xff\xfe\x00\x80 abc\n')" >prompts_bad_utf8
python3 -c "print('a' * 50000000)" >prompts_50mb_line
run "prompts_file_empty" err "$BIN" generate --device cpu -t 1 -n 1 --prompts-file prompts_empty
run "prompts_file_blank_lines" err "$BIN" generate --device cpu -t 1 -n 1 --prompts-file prompts_blank
run "prompts_file_20k_lines" slow "$BIN" generate --device cpu -t 1 -n 1 --prompts-file prompts_20k --json
run "prompts_file_bad_utf8" err "$BIN" generate --device cpu -t 1 -n 1 --prompts-file prompts_bad_utf8
run "prompts_file_50mb_line" err "$BIN" generate --device cpu -t 1 -n 1 --prompts-file prompts_50mb_line
run "prompts_file_hybrid_no_tokenizer" err gen -m "$NEMO" --prompts-file prompts_20k

# ---- hostile config.json of the hybrid families -------------------------------------------------------------------
for fam in nemotron_h bamba granite; do
  case $fam in nemotron_h) base=$NEMO ;; bamba) base=$BAMBA ;; granite) base=$GRANITE ;; esac
  cfg "${fam}_deep" "$base" '.'
  python3 -c "import sys; t = open(sys.argv[1]).read().rstrip().rstrip('}'); open(sys.argv[1], 'w').write(t + ', \"x\": ' + '[' * 100000 + ']' * 100000 + '}')" "cfg_${fam}_deep/config.json"
  cfg "${fam}_hidden_huge" "$base" '.hidden_size = 1073741824'
  cfg "${fam}_hidden_overflow" "$base" '.hidden_size = 9223372036854775807'
  cfg "${fam}_hidden_nan" "$base" '.hidden_size = {"__float__": "NaN"}'
  cfg "${fam}_vocab_huge" "$base" '.vocab_size = 1073741824'
  cfg "${fam}_vocab_1e705" "$base" '.vocab_size = 1e305'
  cfg "${fam}_heads_do_not_divide" "$base" '.num_attention_heads = 3'
  cfg "${fam}_kv_heads_zero" "$base" '.num_key_value_heads = 0'
  cfg "${fam}_kv_heads_do_not_divide" "$base" '.num_key_value_heads = 3'
  cfg "${fam}_head_dim_huge" "$base" '.head_dim = 1073741824'
  cfg "${fam}_intermediate_huge" "$base" '.intermediate_size = 1073741824 | .shared_intermediate_size = 1073741824'
  cfg "${fam}_max_position_huge" "$base" '.max_position_embeddings = 4611686018427387904'
  cfg "${fam}_max_position_zero" "$base" '.max_position_embeddings = 0'
  cfg "${fam}_max_position_negative" "$base" '.max_position_embeddings = -5'
  cfg "${fam}_rope_theta_nan" "$base" '.rope_parameters.rope_theta = {"__float__": "NaN"} | .rope_theta = {"__float__": "NaN"}'
  cfg "${fam}_rope_theta_inf" "$base" '.rope_parameters.rope_theta = {"__float__": "Infinity"}'
  cfg "${fam}_eps_negative" "$base" '.rms_norm_eps = -1 | .layer_norm_epsilon = -1'
  cfg "${fam}_eos_list_huge_ids" "$base" '.eos_token_id = [2, 4294967296]'
  cfg "${fam}_eos_list_nested" "$base" '.eos_token_id = [[2]]'
  cfg "${fam}_eos_list_empty" "$base" '.eos_token_id = []'
  cfg "${fam}_eos_list_long" "$base" ".eos_token_id = [range(0; 200000)]"
  cfg "${fam}_bos_string" "$base" '.bos_token_id = "1"'
  cfg "${fam}_chunk_huge" "$base" '.chunk_size = 1073741824 | .mamba_chunk_size = 1073741824'
  cfg "${fam}_d_conv_huge" "$base" '.conv_kernel = 1073741824 | .mamba_d_conv = 1073741824'
  cfg "${fam}_state_huge" "$base" '.ssm_state_size = 1073741824 | .mamba_d_state = 1073741824'
  cfg "${fam}_layers_huge" "$base" '.num_hidden_layers = 1073741824'
  cfg "${fam}_time_step_limit_nan" "$base" '.time_step_limit = [0, {"__float__": "NaN"}]'
  for c in deep hidden_huge hidden_overflow hidden_nan vocab_huge vocab_1e705 heads_do_not_divide kv_heads_zero \
    kv_heads_do_not_divide intermediate_huge \
    eps_negative eos_list_huge_ids eos_list_nested bos_string d_conv_huge state_huge layers_huge \
    time_step_limit_nan; do
    run "config_${fam}_$c" err gen -m "cfg_${fam}_$c" --tokens-file "$base/tokens.txt"
  done
  # these may load (the weights decide), but must not crash or hang
  for c in max_position_huge max_position_zero max_position_negative head_dim_huge rope_theta_nan rope_theta_inf \
    chunk_huge eos_list_empty eos_list_long; do
    run "config_${fam}_$c" any gen -m "cfg_${fam}_$c" --tokens-file "$base/tokens.txt"
  done
done
# family-specific: layer lists that disagree with counts, products that overflow, sizes that do not divide
cfg nemo_list_disagrees "$NEMO" '.num_hidden_layers = 99'
run "config_nemo_list_disagrees" err gen -m cfg_nemo_list_disagrees --tokens-file "$TOK_N"
cfg nemo_list_huge "$NEMO" '.layers_block_type = [range(0; 2000000) | "mamba"] | del(.num_hidden_layers)'
run "config_nemo_list_huge" err gen -m cfg_nemo_list_huge --tokens-file "$TOK_N"
cfg nemo_list_bogus "$NEMO" '.layers_block_type = ["mamba", 7]'
run "config_nemo_list_bogus" err gen -m cfg_nemo_list_bogus --tokens-file "$TOK_N"
cfg nemo_list_nested "$NEMO" '.layers_block_type = [["mamba"]]'
run "config_nemo_list_nested" err gen -m cfg_nemo_list_nested --tokens-file "$TOK_N"
cfg nemo_pattern_huge "$NEMO" 'del(.layers_block_type) | del(.layer_types) | del(.num_hidden_layers) | .hybrid_override_pattern = "M"'
python3 -c "import json, sys; j = json.load(open(sys.argv[1])); j['hybrid_override_pattern'] = 'M' * 3000000; json.dump(j, open(sys.argv[1], 'w'))" \
  cfg_nemo_pattern_huge/config.json  # jq's join is quadratic here
run "config_nemo_pattern_huge" err gen -m cfg_nemo_pattern_huge --tokens-file "$TOK_N"
cfg nemo_pattern_bad "$NEMO" 'del(.layers_block_type) | del(.layer_types) | .hybrid_override_pattern = "M*\u0000-"'
run "config_nemo_pattern_bad" err gen -m cfg_nemo_pattern_bad --tokens-file "$TOK_N"
cfg nemo_heads_product_overflow "$NEMO" '.mamba_num_heads = 1073741824 | .mamba_head_dim = 1073741824'
run "config_nemo_heads_product_overflow" err gen -m cfg_nemo_heads_product_overflow --tokens-file "$TOK_N"
cfg nemo_heads_product_big "$NEMO" '.mamba_num_heads = 65536 | .mamba_head_dim = 65536'
run "config_nemo_heads_product_big" err gen -m cfg_nemo_heads_product_big --tokens-file "$TOK_N"
cfg nemo_groups_do_not_divide "$NEMO" '.n_groups = 3'
run "config_nemo_groups_do_not_divide" err gen -m cfg_nemo_groups_do_not_divide --tokens-file "$TOK_N"
cfg nemo_kv_product_overflow "$NEMO" '.num_key_value_heads = 1073741824 | .num_attention_heads = 1073741824 | .head_dim = 1073741824'
run "config_nemo_kv_product_overflow" err gen -m cfg_nemo_kv_product_overflow --tokens-file "$TOK_N"
cfg nemo_mtp "$NEMO" '.num_nextn_predict_layers = 1'
run "config_nemo_mtp_ignored_ok" ok gen -m cfg_nemo_mtp --tokens-file "$TOK_N"  # MTP layers declared, not run (issue 48)
cfg granite_list_disagrees "$GRANITE" '.num_hidden_layers = 99'
run "config_granite_list_disagrees" err gen -m cfg_granite_list_disagrees --tokens-file "$GRANITE/tokens.txt"
cfg granite_list_huge "$GRANITE" '.num_hidden_layers = 2000000 | .layer_types = [range(0; 2000000) | "mamba"]'
run "config_granite_list_huge" err gen -m cfg_granite_list_huge --tokens-file "$GRANITE/tokens.txt"
cfg granite_expand_huge "$GRANITE" '.mamba_expand = 1e300'
run "config_granite_expand_huge" err gen -m cfg_granite_expand_huge --tokens-file "$GRANITE/tokens.txt"
cfg granite_expand_nan "$GRANITE" '.mamba_expand = {"__float__": "NaN"}'
run "config_granite_expand_nan" err gen -m cfg_granite_expand_nan --tokens-file "$GRANITE/tokens.txt"
cfg granite_expand_fraction "$GRANITE" '.mamba_expand = 1.37'
run "config_granite_expand_fraction" err gen -m cfg_granite_expand_fraction --tokens-file "$GRANITE/tokens.txt"
cfg granite_d_head_disagrees "$GRANITE" '.mamba_d_head = 7'
run "config_granite_d_head_disagrees" err gen -m cfg_granite_d_head_disagrees --tokens-file "$GRANITE/tokens.txt"
cfg granite_moe "$GRANITE" '.num_local_experts = 4'
run "config_granite_moe" err gen -m cfg_granite_moe --tokens-file "$GRANITE/tokens.txt"  # experts declared, none stored
cfg granite_multiplier_nan "$GRANITE" '.embedding_multiplier = {"__float__": "NaN"}'
run "config_granite_multiplier_nan" err gen -m cfg_granite_multiplier_nan --tokens-file "$GRANITE/tokens.txt"
cfg granite_multiplier_zero "$GRANITE" '.logits_scaling = 0'
run "config_granite_multiplier_zero" err gen -m cfg_granite_multiplier_zero --tokens-file "$GRANITE/tokens.txt"
cfg granite_rope_factor_tiny "$GRANITE" '.position_embedding_type = "rope" | .partial_rotary_factor = 1e-300'
run "config_granite_rope_factor_tiny" err gen -m cfg_granite_rope_factor_tiny --tokens-file "$GRANITE/tokens.txt"
cfg bamba_attn_index_past "$BAMBA" '.attn_layer_indices = [1, 5]'
run "config_bamba_attn_index_past" err gen -m cfg_bamba_attn_index_past --tokens-file "$BAMBA/tokens.txt"
cfg bamba_attn_index_negative "$BAMBA" '.attn_layer_indices = [-1]'
run "config_bamba_attn_index_negative" err gen -m cfg_bamba_attn_index_negative --tokens-file "$BAMBA/tokens.txt"
cfg bamba_attn_index_huge "$BAMBA" '.attn_layer_indices = [9223372036854775807]'
run "config_bamba_attn_index_huge" err gen -m cfg_bamba_attn_index_huge --tokens-file "$BAMBA/tokens.txt"
cfg bamba_attn_index_float "$BAMBA" '.attn_layer_indices = [1.5]'
run "config_bamba_attn_index_float" err gen -m cfg_bamba_attn_index_float --tokens-file "$BAMBA/tokens.txt"
cfg bamba_attn_index_dup "$BAMBA" '.attn_layer_indices = [1, 1, 4]'
cfg bamba_attn_index_long "$BAMBA" '.attn_layer_indices = [range(0; 3000000) | 1]'
run "config_bamba_attn_index_long" err gen -m cfg_bamba_attn_index_long --tokens-file "$BAMBA/tokens.txt"
cfg bamba_layers_huge "$BAMBA" '.num_hidden_layers = 1073741824 | .attn_layer_indices = []'
run "config_bamba_layers_huge" err gen -m cfg_bamba_layers_huge --tokens-file "$BAMBA/tokens.txt"
cfg bamba_rope_factor_odd "$BAMBA" '.rope_parameters.partial_rotary_factor = 0.3'
run "config_bamba_rope_factor_odd" any gen -m cfg_bamba_rope_factor_odd --tokens-file "$BAMBA/tokens.txt"
run "config_bamba_attn_index_dup" any gen -m cfg_bamba_attn_index_dup --tokens-file "$BAMBA/tokens.txt"

# ---- state files of the hybrids (v4: KV tables and a dtype) --------------------------------------------------------
# A valid state file of each hybrid, then forged ones. The layout is src/model/state_cache.cpp's.
for fam in nemotron_h bamba granite; do
  case $fam in nemotron_h) base=$NEMO ;; bamba) base=$BAMBA ;; granite) base=$GRANITE ;; esac
  "$BIN" generate --device cpu -t 1 -n 2 -m "$base" --tokens-file "$base/tokens.txt" --save-state "state_$fam.bin" >/dev/null 2>&1
  "$BIN" generate --device cpu -t 1 -n 2 -m "$base" --tokens-file "$base/tokens.txt" --save-state "state_${fam}_bf16.bin" \
    --state-dtype bf16 >/dev/null 2>&1
  python3 "$ROOT/scripts/hostile_state_files.py" "state_$fam.bin" "forged_$fam" || echo "forging $fam failed"
  for f in forged_"$fam"/*.bin; do
    n=$(basename "$f" .bin)
    # past the context: refused where the model has a limit (Bamba: max_position_embeddings), else a valid file
    expect=err; [ "$n" = kv_rows_past_context ] && [ "$fam" != bamba ] && expect=any
    run "state_${fam}_$n" $expect gen -m "$base" --tokens-file "$base/tokens.txt" --load-state "$f"
  done
  run "state_${fam}_valid_ok" ok gen -m "$base" --tokens-file "$base/tokens.txt" --load-state "state_$fam.bin"
  run "state_${fam}_dtype_mismatch" err gen -m "$base" --tokens-file "$base/tokens.txt" --load-state "state_${fam}_bf16.bin"
  run "state_${fam}_bf16_ok" ok gen -m "$base" --tokens-file "$base/tokens.txt" --load-state "state_${fam}_bf16.bin" --state-dtype bf16
  run "state_${fam}_past_ctx_size" err gen -m "$base" --tokens-file "$base/tokens.txt" --load-state "state_$fam.bin" --ctx-size 10
  run "state_${fam}_is_dir" err gen -m "$base" --tokens-file "$base/tokens.txt" --load-state /tmp
  other=state_nemotron_h.bin; [ "$fam" = nemotron_h ] && other=state_bamba.bin
  [ -f "$other" ] || "$BIN" generate --device cpu -t 1 -n 2 -m "$BAMBA" --tokens-file "$BAMBA/tokens.txt" --save-state "$other" >/dev/null 2>&1
  run "state_${fam}_of_another_family" err gen -m "$base" --tokens-file "$base/tokens.txt" --load-state "$other"
  run "state_${fam}_save_to_dir" err gen -m "$base" --tokens-file "$base/tokens.txt" --save-state /tmp
done

# ---- summary: findings ----------------------------------------------------------------------------------------------
awk -F'\t' 'NR > 1 {
  bad = ($4 != "-" && $2 != "slow") || (($3 == 137 || $3 == 124) && $2 != "slow") ||
        ($2 == "err" && ($3 != 1 || $7 == "")) || ($2 == "ok" && $3 != 0) || ($2 == "any" && $3 != 0 && $3 != 1)
  if (bad) { print "FINDING\t" $0; n++ }
  total++
} END { printf "%d cases, %d findings (table: %s)\n", total, n, FILENAME }' "$RESULTS"
