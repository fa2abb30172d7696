// optimizer and scheduler, as DeepSpeed builds them (runtime/engine.py,
// _configure_basic_optimizer and _scheduler_from_config): a type it knows
// (its own optimizers and schedules, or any of torch.optim's), and params
// passed as keyword arguments, so that an unknown one is refused.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "zest/config/detail/config_sections.h"
#include "zest/config/detail/json_parse.h"
#include "zest/core/check.h"

namespace zest::config_detail {
namespace {

struct Named {
  const char* name;
  const char* feature;
};

// Optimizers DeepSpeed builds that ZEST does not have (DEEPSPEED_OPTIMIZERS
// in runtime/config.py), and torch.optim's, which DeepSpeed looks up by name.
constexpr Named kOtherOptimizers[] = {
    {"OneBitAdam", "1-bit Adam (compressed communication)"},
    {"ZeroOneAdam", "0/1 Adam (compressed communication)"},
    {"OneBitLamb", "1-bit LAMB (compressed communication)"},
    {"Adagrad", "the Adagrad optimizer"},
    {"Lion", "the Lion optimizer"},
    {"MuAdam", "muP's MuAdam optimizer"},
    {"MuAdamW", "muP's MuAdamW optimizer"},
    {"MuSGD", "muP's MuSGD optimizer"},
    {"Adadelta", "torch.optim.Adadelta"},
    {"Adafactor", "torch.optim.Adafactor"},
    {"Adamax", "torch.optim.Adamax"},
    {"ASGD", "torch.optim.ASGD"},
    {"LBFGS", "torch.optim.LBFGS"},
    {"NAdam", "torch.optim.NAdam"},
    {"RAdam", "torch.optim.RAdam"},
    {"RMSprop", "torch.optim.RMSprop"},
    {"Rprop", "torch.optim.Rprop"},
    {"SparseAdam", "torch.optim.SparseAdam"},
};

// Schedules DeepSpeed builds that ZEST does not have: its own (runtime/
// lr_schedules.py) and torch.optim.lr_scheduler's, looked up by name.
constexpr Named kOtherSchedules[] = {
    {"LRRangeTest", "DeepSpeed's LRRangeTest schedule"},
    {"OneCycle", "DeepSpeed's OneCycle schedule (with momentum cycling)"},
    {"LambdaLR", "torch.optim.lr_scheduler.LambdaLR"},
    {"MultiplicativeLR", "torch.optim.lr_scheduler.MultiplicativeLR"},
    {"StepLR", "torch.optim.lr_scheduler.StepLR"},
    {"MultiStepLR", "torch.optim.lr_scheduler.MultiStepLR"},
    {"ConstantLR", "torch.optim.lr_scheduler.ConstantLR"},
    {"LinearLR", "torch.optim.lr_scheduler.LinearLR"},
    {"ExponentialLR", "torch.optim.lr_scheduler.ExponentialLR"},
    {"SequentialLR", "torch.optim.lr_scheduler.SequentialLR"},
    {"CosineAnnealingLR", "torch.optim.lr_scheduler.CosineAnnealingLR"},
    {"ChainedScheduler", "torch.optim.lr_scheduler.ChainedScheduler"},
    {"ReduceLROnPlateau", "torch.optim.lr_scheduler.ReduceLROnPlateau"},
    {"CyclicLR", "torch.optim.lr_scheduler.CyclicLR"},
    {"CosineAnnealingWarmRestarts", "torch.optim.lr_scheduler.CosineAnnealingWarmRestarts"},
    {"OneCycleLR", "torch.optim.lr_scheduler.OneCycleLR"},
    {"PolynomialLR", "torch.optim.lr_scheduler.PolynomialLR"},
};

// The type of an optimizer or scheduler section: the index into `ours`, or
// -1 (absent, a problem, or a known type ZEST lacks: a problem naming it).
template <size_t N>
int read_type(Section& s, const std::vector<std::string>& ours, const Named (&others)[N], const char* what) {
  const json* v = s.get("type");
  if (!v) {
    s.problem("type", fmt::format("is required: DeepSpeed builds no {} without one; ZEST has {}", what,
                                  fmt::join(ours, ", ")));
    return -1;
  }
  if (!v->is_string()) {
    s.problem("type", fmt::format("must be a string, got {}", detail::json_brief(*v)));
    return -1;
  }
  const std::string name = v->get<std::string>();
  for (size_t i = 0; i < ours.size(); ++i) {
    if (lower(ours[i]) == lower(name)) return static_cast<int>(i);
  }
  for (const Named& o : others) {
    if (lower(o.name) == lower(name)) {
      s.problem("type", fmt::format("is \"{}\": that asks for {}, which ZEST does not have; it has {}", name,
                                    o.feature, fmt::join(ours, ", ")));
      return -1;
    }
  }
  std::vector<std::string> all = ours;
  for (const Named& o : others) all.emplace_back(o.name);
  const auto near = did_you_mean(name, all);
  s.problem("type", fmt::format("is \"{}\", which is no {} DeepSpeed knows{}; ZEST has {}", name, what,
                                near ? fmt::format(" (did you mean \"{}\"?)", *near) : "", fmt::join(ours, ", ")));
  return -1;
}

// torch's keyword arguments that choose an implementation, not the values.
void ignore_torch_impl(Section& p) {
  for (const char* k : {"foreach", "capturable", "differentiable", "fused"})
    p.ignore(k, "selects torch's implementation of the update, not its values");
  p.refuse_if("maximize", is_on, "maximizing the objective (maximize)", "false, as in ZEST");
}

// betas, eps and bias_correction: Adam's and LAMB's alike.
void read_moment_params(Section& p, FileState& file, OptimizerConfig& o) {
  const AutoValues& a = file.program;
  if (const json* b = p.get("betas")) {
    const bool is_auto = b->is_string() && b->get<std::string>() == "auto";
    if (is_auto && a.beta1 && a.beta2) {
      o.beta1 = static_cast<float>(*a.beta1);
      o.beta2 = static_cast<float>(*a.beta2);
      file.filled(p.where("betas"), fmt::format("[{}, {}] (from AutoValues::beta1, beta2)", *a.beta1, *a.beta2));
    } else if (is_auto) {
      file.filled(p.where("betas"), "[0.9, 0.999] (the default; set AutoValues::beta1 and beta2 to choose them)");
    } else if (!(b->is_array() && b->size() == 2 && (*b)[0].is_number() && (*b)[1].is_number())) {
      p.problem("betas", fmt::format("must be a list of two numbers, got {}", detail::json_brief(*b)));
    } else {
      const double b1 = (*b)[0].get<double>(), b2 = (*b)[1].get<double>();
      for (const auto& [i, beta] : {std::pair{0, b1}, std::pair{1, b2}}) {
        // Checked as written: 0.99999999999 rounds to 1 in fp32.
        if (!(beta >= 0.0 && static_cast<float>(beta) < 1.0f)) {
          p.problem("betas", fmt::format("[{}] is {}; allowed: 0 to below 1 (after rounding to fp32, the optimizer's "
                                         "precision: at most 0.99999994)",
                                         i, beta));
        }
      }
      if (a.beta1 && a.beta2 && (b1 != *a.beta1 || b2 != *a.beta2)) {
        file.mismatch(p.where("betas"), fmt::format("[{}, {}] in the file, [{}, {}] from AutoValues::beta1, beta2: "
                                                    "the file's values are used (write \"auto\" to take the "
                                                    "program's)",
                                                    b1, b2, *a.beta1, *a.beta2));
      }
      o.beta1 = static_cast<float>(b1);
      o.beta2 = static_cast<float>(b2);
    }
  }
  const AutoRule<double> eps{a.eps, "eps"};
  p.read_float("eps", o.eps, 1e-38, 1.0, &eps);
  p.read_bool("bias_correction", o.bias_correction);
}

void read_adam_params(Section& p, FileState& file, OptimizerConfig& o, bool adamw_type, bool& torch_adam) {
  // DeepSpeed's Adam is FusedAdam with adam_w_mode on unless it is false;
  // the type "AdamW" is AdamW whatever adam_w_mode says.
  bool adam_w_mode = true;
  p.read_bool("adam_w_mode", adam_w_mode);
  o.kind = adamw_type || adam_w_mode ? OptimizerKind::kAdamW : OptimizerKind::kAdam;
  read_moment_params(p, file, o);
  // torch_adam: torch.optim.Adam / AdamW take the same update; only AdamW's
  // default weight decay differs (torch's 0.01, FusedAdam's 0), and
  // read_optimizer applies it.
  p.read_bool("torch_adam", torch_adam);
  p.ignore("set_grad_none", "how DeepSpeed's FusedAdam clears gradients; ZEST manages its own");
  p.refuse_if("amsgrad", is_on, "the AMSGrad variant of Adam", "false, as in ZEST");
  if (const json* v = p.get("max_grad_norm")) {
    p.problem("max_grad_norm", fmt::format("is {}: DeepSpeed refuses max_grad_norm as an optimizer parameter; "
                                           "write it as the top-level gradient_clipping",
                                           detail::json_brief(*v)));
  }
}

// DeepSpeed's Lamb is FusedLamb(params, **optimizer_params): its keyword
// arguments, with its defaults (OptimizerConfig's).
void read_lamb_params(Section& p, FileState& file, OptimizerConfig& o) {
  read_moment_params(p, file, o);
  p.read_float("max_coeff", o.max_coeff, 1e-30, 1e30);
  p.read_float("min_coeff", o.min_coeff, 1e-30, 1e30);
  p.read_bool("eps_inside_sqrt", o.eps_inside_sqrt);
  p.refuse_if("amsgrad", is_on, "the AMSGrad variant (FusedLamb refuses it too)", "false, as in ZEST");
  // FusedLamb clips by a norm its caller passes, which DeepSpeed's engine
  // never does (a max_grad_norm above 0 fails there): only 0 means anything.
  p.refuse_if("max_grad_norm", [](const json& v) { return !(v.is_number() && v.get<double>() == 0.0); },
              "FusedLamb's own clipping (max_grad_norm; DeepSpeed's engine passes it no norm)",
              "0: no clipping by the optimizer; the top-level gradient_clipping clips");
}

void read_sgd_params(Section& p, OptimizerConfig& o) {
  p.read_float("momentum", o.momentum, 0.0, 0.999999);
  p.read_float("dampening", o.dampening, 0.0, 1.0);
  p.read_bool("nesterov", o.nesterov);
}

}  // namespace

// Note [a file without an optimizer or scheduler]. DeepSpeed builds an
// optimizer only from the file's section; without one it steps the
// optimizer the program passes to deepspeed.initialize (Hugging Face's
// Trainer builds AdamW from its own arguments, weight decay 0 unless set),
// and without a scheduler section the program's schedule, if any. ZEST has
// no client optimizer object, so the program says what it would have
// passed: AutoValues::optimizer / scheduler, or (for the optimizer) the
// Trainer's AdamW from AutoValues::learning_rate. Taking a default instead
// would train with values nobody chose.
void program_optimizer(FileState& file) {
  const AutoValues& a = file.program;
  OptimizerConfig& o = file.out.optimizer;
  if (a.optimizer) {
    o = *a.optimizer;
    file.filled("optimizer", fmt::format("{} lr {} weight_decay {} (from AutoValues::optimizer: the file has no "
                                         "optimizer section)",
                                         optimizer_name(o.kind), o.lr, o.weight_decay));
  } else if (a.learning_rate) {
    o = OptimizerConfig{};
    o.kind = OptimizerKind::kAdamW;
    o.lr = static_cast<float>(*a.learning_rate);
    o.weight_decay = static_cast<float>(a.weight_decay.value_or(0.0));
    if (a.beta1 && a.beta2) {
      o.beta1 = static_cast<float>(*a.beta1);
      o.beta2 = static_cast<float>(*a.beta2);
    }
    if (a.eps) o.eps = static_cast<float>(*a.eps);
    file.filled("optimizer", fmt::format("AdamW lr {} weight_decay {} betas [{}, {}] eps {} (the file has no "
                                         "optimizer section: Hugging Face's Trainer AdamW from AutoValues::"
                                         "learning_rate, weight_decay, beta1, beta2, eps)",
                                         *a.learning_rate, a.weight_decay.value_or(0.0), o.beta1, o.beta2, o.eps));
  } else {
    file.problem("optimizer: the file has no optimizer section, so DeepSpeed would step the program's own "
                 "optimizer: set AutoValues::optimizer (or AutoValues::learning_rate for Hugging Face's AdamW), or "
                 "write an optimizer section");
    return;
  }
  try {
    o.validate();
  } catch (const Error& e) {
    file.problem("AutoValues::optimizer: " + e.message());
  }
}

void read_optimizer(Section& top, FileState& file) {
  std::optional<Section> s = top.sub("optimizer", Unknown::kIgnoreUnlessTypo);
  if (!s) {
    if (!top.get("optimizer")) program_optimizer(file);  // absent, not malformed
    return;
  }
  OptimizerConfig& o = file.out.optimizer;
  const size_t problems_before = file.problems.size();
  s->ignore("legacy_fusion", "selects DeepSpeed's older fused kernels: the same update");
  const int type = read_type(*s, {"AdamW", "Adam", "SGD", "Lamb"}, kOtherOptimizers, "optimizer");
  std::optional<Section> p = s->sub("params", Unknown::kRefuse);
  s->finish();
  if (type < 0) return;  // its params belong to an optimizer ZEST does not have
  // DeepSpeed's engine asserts dynamic loss scaling for Lamb
  // (_do_sanity_check: fp16.loss_scale 0), whatever the precision.
  if (type == 3 && file.out.fp16.loss_scale != 0.0) {
    file.problem(fmt::format("optimizer Lamb with the static fp16.loss_scale {}: DeepSpeed requires dynamic loss "
                             "scaling with Lamb; set fp16.loss_scale to 0",
                             file.out.fp16.loss_scale));
  }
  const AutoValues& a = file.program;
  o.kind = type == 2 ? OptimizerKind::kSgd : type == 3 ? OptimizerKind::kLamb : OptimizerKind::kAdamW;
  // DeepSpeed's defaults: FusedAdam's (lr 1e-3, weight_decay 0, unlike
  // torch.optim.AdamW's 0.01), FusedLamb's (the same, max_coeff 10,
  // min_coeff 0.01) and torch SGD's.
  o.weight_decay = 0.0f;
  if (!p) return;
  // torch.optim.SGD has no default lr: "auto" needs the program's.
  const AutoRule<double> lr{a.learning_rate, "learning_rate", "", true, type != 2};
  const AutoRule<double> wd{a.weight_decay, "weight_decay"};
  p->read_float("lr", o.lr, 0.0, 1e6, &lr);
  p->read_int("host_threads", o.host_threads, 1, 1024);  // ZEST's own: OptimizerConfig::host_threads
  bool torch_adamw = false;
  if (type == 2) {
    read_sgd_params(*p, o);
  } else if (type == 3) {
    read_lamb_params(*p, file, o);
  } else {
    bool torch_adam = false;
    read_adam_params(*p, file, o, type == 0, torch_adam);
    torch_adamw = torch_adam && o.kind == OptimizerKind::kAdamW;
  }
  // torch.optim.AdamW's default weight decay is 0.01 (FusedAdam's and
  // torch.optim.Adam's 0), an unfilled "auto" included.
  if (torch_adamw) o.weight_decay = 0.01f;
  if (!p->read_float("weight_decay", o.weight_decay, 0.0, 1e6, &wd) && torch_adamw && !p->get("weight_decay")) {
    file.filled(p->where("weight_decay"), "0.01 (not written: torch_adam builds torch.optim.AdamW, whose default "
                                          "it is)");
  }
  if (type != 3) ignore_torch_impl(*p);  // FusedLamb takes no such keyword: unknown there
  p->finish();
  if (file.problems.size() != problems_before) return;  // validate() would only repeat them
  try {
    o.validate();
  } catch (const Error& e) {
    file.problem("optimizer: " + e.message());
  }
}

void read_scheduler(Section& top, FileState& file) {
  std::optional<Section> s = top.sub("scheduler", Unknown::kIgnoreUnlessTypo);
  LrScheduleConfig& c = file.out.scheduler;
  if (!s) {
    if (top.get("scheduler")) return;  // malformed: already a problem
    // Note [a file without an optimizer or scheduler].
    if (!file.program.scheduler) {
      file.problem("scheduler: the file has no scheduler section, so DeepSpeed would step the program's own "
                   "schedule, if any: set AutoValues::scheduler (LrScheduleConfig{} for a constant learning rate), "
                   "or write a scheduler section");
      return;
    }
    c = *file.program.scheduler;
    file.filled("scheduler", fmt::format("{} (from AutoValues::scheduler: the file has no scheduler section)",
                                         lr_schedule_name(c.kind)));
    try {
      c.validate();
    } catch (const Error& e) {
      file.problem("AutoValues::scheduler: " + e.message());
    }
    return;
  }
  const size_t problems_before = file.problems.size();
  const int type = read_type(*s, {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}, kOtherSchedules, "schedule");
  std::optional<Section> p = s->sub("params", Unknown::kRefuse);
  s->finish();
  if (type < 0) return;
  c.kind = type == 0 ? LrScheduleKind::kWarmupLR : type == 1 ? LrScheduleKind::kWarmupDecayLR
                                                             : LrScheduleKind::kWarmupCosineLR;
  const AutoValues& a = file.program;
  // Hugging Face fills warmup_min_lr with 0 whatever the program says.
  const AutoRule<double> min_lr{0.0, "(none)", "0, as Hugging Face fills it", false};
  const AutoRule<double> max_lr{a.learning_rate, "learning_rate"};
  const AutoRule<int64_t> warmup{a.warmup_steps, "warmup_steps"};
  const AutoRule<int64_t> total{a.total_steps, "total_steps", "", true, false};
  if (p) {
    if (c.kind == LrScheduleKind::kWarmupCosineLR) {
      p->read_double("warmup_min_ratio", c.warmup_min_ratio, 0.0, 1.0);
      p->read_double("cos_min_ratio", c.cos_min_ratio, 0.0, 1.0);
    } else {
      p->read_double("warmup_min_lr", c.warmup_min_lr, 0.0, 1e6, &min_lr);
      // WarmupLR's warmup_max_lr defaults to the optimizer's lr (None in
      // DeepSpeed's signature); WarmupDecayLR's to 0.001.
      if (c.kind == LrScheduleKind::kWarmupLR) c.warmup_max_lr = file.out.optimizer.lr;
      p->read_double("warmup_max_lr", c.warmup_max_lr, 0.0, 1e6, &max_lr);
    }
    // DeepSpeed's schedules take max(2, warmup_num_steps) (lr_schedules.py),
    // so 0 and less are accepted and warm up over 2 steps, as the schedule
    // here does (optim/lr_schedule.cpp).
    p->read_int("warmup_num_steps", c.warmup_num_steps, -kMaxCount, kMaxCount, &warmup);
    c.warmup_num_steps = std::max<int64_t>(0, c.warmup_num_steps);
    if (c.kind != LrScheduleKind::kWarmupLR) p->read_int("total_num_steps", c.total_num_steps, 1, kMaxCount, &total);
    const int wt = p->read_choice("warmup_type", {"log", "linear"});
    if (wt >= 0) c.warmup_type = wt == 0 ? WarmupType::kLog : WarmupType::kLinear;
    p->refuse_if("last_batch_iteration",
                 [](const json& v) { return !(v.is_number() && v.get<double>() == -1.0); },
                 "starting the schedule part-way (last_batch_iteration; ZEST resumes schedules from its "
                 "checkpoints)",
                 "-1: the schedule starts at its beginning, as in ZEST");
    p->finish();
  } else if (c.kind == LrScheduleKind::kWarmupLR) {
    c.warmup_max_lr = file.out.optimizer.lr;
  }
  if (c.kind == LrScheduleKind::kWarmupLR && !(p && p->value().contains("warmup_max_lr"))) {
    file.filled("scheduler.params.warmup_max_lr", fmt::format("{} (not written: DeepSpeed's WarmupLR takes the "
                                                              "optimizer's lr)",
                                                              c.warmup_max_lr));
  }
  // DeepSpeed's WarmupDecayLR and WarmupCosineLR take total_num_steps as a
  // required argument.
  if (c.kind != LrScheduleKind::kWarmupLR && !(p && p->get("total_num_steps"))) {
    file.problem(fmt::format("scheduler.params.total_num_steps is required by {}",
                             type == 1 ? "WarmupDecayLR" : "WarmupCosineLR"));
    return;
  }
  if (file.problems.size() != problems_before) return;  // validate() would only repeat them
  if (c.kind != LrScheduleKind::kWarmupLR && c.total_num_steps < std::max<int64_t>(2, c.warmup_num_steps)) {
    // DeepSpeed warns and runs: the decay never starts before the end.
    file.warn("scheduler.params.total_num_steps",
              fmt::format("{} is less than warmup_num_steps {}: the schedule warms up past the end of training "
                          "(DeepSpeed warns and runs it; so does ZEST)",
                          c.total_num_steps, std::max<int64_t>(2, c.warmup_num_steps)));
  }
  try {
    c.validate();
  } catch (const Error& e) {
    file.problem("scheduler: " + e.message());
  }
}

}  // namespace zest::config_detail
