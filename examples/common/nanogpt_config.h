#pragma once

// nanoGPT's config files as train_gpt's flags:
//
//   train_gpt --config nanoGPT/config/train_shakespeare_char.py
//
// trains what `python train.py config/train_shakespeare_char.py` trains: a
// config file assigns some of train.py's globals, and every global it does
// not assign keeps train.py's default (GPT-2 124M on OpenWebText), as in
// nanoGPT. The names as train_gpt's flags (docs/gpt.md, "nanoGPT's config
// files"):
//
//   n_layer n_head n_embd block_size  --layers --heads --width --context
//   dropout bias batch_size           --dropout --bias --batch-size
//   learning_rate weight_decay beta1 beta2 grad_clip min_lr
//                                     --lr --weight-decay --beta1 --beta2
//                                     --max-grad-norm --min-lr
//   gradient_accumulation_steps       --accumulation-steps (divided among
//                                     torchrun's WORLD_SIZE ranks)
//   max_iters warmup_iters eval_interval log_interval
//                                     --steps --warmup-steps --eval-every
//                                     (and --checkpoint-every) --log-every,
//                                     each times the batches of an iteration
//   decay_lr = False                  --schedule constant
//   eval_iters eval_only              --eval-batches --eval-only
//   dataset                           --data data/DATASET
//   out_dir                           --checkpoint OUT_DIR/lamp.pt
//   init_from = 'resume'              --resume OUT_DIR/lamp.pt
//   init_from = 'gpt2'...             GPT-2's shape; --init-from FILE given
//   dtype device                      --precision (unset: auto) --device
//   sample.py's start num_samples max_new_tokens temperature top_k seed
//                                     --prompt (--prompt-file for
//                                     FILE:...) --num-samples --sample-tokens
//                                     --temperature --top-k --seed
//
// compile, backend and always_save_checkpoint have no flag (lamp keeps the
// last and the best checkpoints; CUDA graphs stand for compile);
// wandb_log = True gets a note. Any other name is refused, with the nearest
// of nanoGPT's.

#include <string>
#include <vector>

#include "config_file.h"

namespace lamp_examples {

/// The flags for `file`, a nanoGPT config file (read_config_file() of a
/// *.py file): a PythonConfigReader for parse_command_line(). Reads
/// WORLD_SIZE (torchrun's) to divide gradient_accumulation_steps, and
/// whether DATA/meta.pkl exists to pick the vocabulary as train.py does
/// (50,304 without one). Throws ConfigFileError for a name nanoGPT does not
/// have, a value of the wrong kind, an expression it does not evaluate where
/// the value is used, and init_from = 'gpt2...' without --init-from (lamp
/// downloads nothing).
std::vector<ConfigFlag> nanogpt_config_flags(const ConfigFile& file,
                                             const GivenFlag& given,
                                             std::vector<std::string>& notes);

/// For an unknown flag spelled as nanoGPT's --key=value override
/// ("--max_iters"): which of train_gpt's flags it is, for the error's hint
/// (set_flag_hint()): "nanoGPT's max_iters is train_gpt's --steps, counted
/// in batches (max_iters x gradient_accumulation_steps)". "" for any other
/// name.
std::string nanogpt_flag_hint(const std::string& flag);

} // namespace lamp_examples
