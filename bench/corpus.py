"""A deterministic, seeded corpus of AI-agent conversations for storage and search benchmarks.

What it models: the sessions an agent writes to its store. A user prompt; assistant turns that
call tools (terminal, read_file, write_file, patch, search_files, execute_code, web_search,
web_extract, browser_*) in the OpenAI format, arguments as JSON strings with realistic paths
and commands; tool results of 1–8 KB (command output, file contents, test logs, JSON, stack
traces; only write_file's acknowledgement is a short line); assistant prose with markdown and
code blocks, some of it carrying reasoning. Sessions come from the CLI, chat platforms, cron
and the API, last 20–400 messages (mostly short), are spread over about six months, and about
15% of them are written in Chinese, Japanese or Korean, with code, paths and tool output mixed
in as they are in real use.

Why: what a store costs depends on what it stores. Tool output is most of the bytes and few of
the searches, prose is the reverse, CJK text goes through the bigram index, and a Zipf-shaped
vocabulary makes queries range from very common to rare. A synthetic corpus with those
proportions gives numbers that are stable and comparable across runs and machines, without
anyone's real conversations.

How:

* Vocabulary: hand-written word lists (English, and a few hundred real words each for Chinese,
  Japanese and Korean) plus identifiers, class names and paths built combinatorially, drawn
  with Zipf weights. From them, pools of sentences, code lines, log lines, test lines, search
  results and so on are rendered once per process with a fixed seed. The pools are part of the
  vocabulary; the corpus seed only decides what is drawn from them.
* Speed: a tool result is a few draws from those pools joined together, and each message is a
  handful of random calls, so 200,000 messages take seconds on one core.
* Determinism and prefixes: session ``i`` draws everything from its own ``Random`` seeded with
  ``(seed, i)``, and CJK sessions are placed by a schedule of blocks of 20 sessions (exactly 3
  per block; the first block holds one each of Chinese, Japanese and Korean). The text of a
  session thus does not depend on ``total_messages``, except for the last one or two sessions,
  which are shortened to make the count exact (a shortened session is a prefix of the whole
  one, less the calls of its last turn whose results were cut off). Timestamps and session ids
  do depend on it: every corpus spans about six months.
* Query guarantee: :func:`query_terms` draws its queries from the sessions that are whole in
  every corpus of at least ``QUERY_GUARANTEE_MESSAGES`` messages with the same seed, so each
  query matches the content of at least one user or assistant message of any such corpus.
  "Matches" means: an English term is an FTS5 ``unicode61`` token of the content (lower case,
  split at everything but letters and digits, so ``load_session`` is ``load`` ``session``); both
  terms of a 2-term query are in the same message; a phrase is a run of consecutive tokens; a
  CJK query is a substring of the content.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

__all__ = [
    "MAX_SESSION_MESSAGES",
    "MIN_SESSION_MESSAGES",
    "QUERY_GUARANTEE_MESSAGES",
    "CorpusMessage",
    "CorpusSession",
    "content_bytes",
    "generate_corpus",
    "query_terms",
]

Role = Literal["user", "assistant", "tool"]
Language = Literal["en", "zh", "ja", "ko"]

MIN_SESSION_MESSAGES = 20
MAX_SESSION_MESSAGES = 400
QUERY_GUARANTEE_MESSAGES = 10_000

_EPOCH = 1_735_689_600.0  # 2025-01-01T00:00:00Z
_SPAN_SECONDS = 182 * 86_400.0
# Session length is MIN + (MAX - MIN + 1) * u**3: mean about 115, median about 67.
_LENGTH_SKEW = 3
_MEAN_SESSION_MESSAGES = MIN_SESSION_MESSAGES + (MAX_SESSION_MESSAGES - MIN_SESSION_MESSAGES) / 4
_LANGUAGE_BLOCK = 20
_CJK_PER_BLOCK = 3
_TOOL_RESULT_MIN = 1_200
_TOOL_RESULT_MAX = 7_600
_RUN = 6  # pool lines drawn together (see _Pool.lines)


@dataclass(frozen=True, slots=True)
class CorpusMessage:
    """One stored message; fields mirror the arguments of ``append_message``."""

    role: Role
    content: str | None
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None
    tool_name: str | None
    timestamp: float
    finish_reason: str | None
    reasoning: str | None
    token_count: int | None

    def as_append_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``append_message(session_id, **kwargs)``, Nones left out."""
        kwargs: dict[str, Any] = {
            "role": self.role,
            "content": self.content,
            "tool_calls": self.tool_calls,
            "tool_call_id": self.tool_call_id,
            "tool_name": self.tool_name,
            "timestamp": self.timestamp,
            "finish_reason": self.finish_reason,
            "reasoning": self.reasoning,
            "token_count": self.token_count,
        }
        return {key: value for key, value in kwargs.items() if value is not None}


@dataclass(frozen=True, slots=True)
class CorpusSession:
    session_id: str
    source: str
    model: str
    started_at: float
    language: Language
    messages: tuple[CorpusMessage, ...]


# ---------------------------------------------------------------------------------------------
# Word lists
# ---------------------------------------------------------------------------------------------


def _words(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(text.split()))


# Roughly most common first: the order is the Zipf rank.
_EN_NOUNS = _words("""
session message token database config gateway request response server client cache index
query table column row schema migration transaction lock timeout retry error exception warning
log logger handler worker process thread queue task job scheduler pipeline build release
deployment container image cluster node service endpoint route router middleware proxy socket
connection pool buffer stream file directory path folder repository branch commit merge patch
diff tag version dependency package module plugin extension library framework script command
argument option flag parameter variable constant function method class interface type struct
field attribute property value key secret credential password user account profile permission
role group team project issue ticket bug feature test fixture assertion benchmark metric counter
gauge histogram trace span event alert dashboard report summary document page section paragraph
sentence word character string number integer float array list map dictionary object record
entry item element payload header body cookie certificate domain address port host network
bandwidth latency throughput memory disk core storage backup snapshot checkpoint archive upload
download browser tab window screen button link form input output prompt model context embedding
vector agent tool skill conversation reply answer question email calendar meeting invite
reminder note draft invoice budget price order customer product market stock weather forecast
flight hotel trip recipe article paper blog podcast video photo chart spreadsheet slide channel
bot webhook notification subscription license policy quota limit cost usage billing provider
platform adapter transcript history lineage title source origin delivery ledger admission
handoff compression summary encoding tokenizer trigram bigram ranking score snippet highlight
cursor offset page batch chunk shard replica leader follower heartbeat lease deadline budget
invariant regression rollback hotfix changelog roadmap milestone sprint standup retro review
approval reviewer maintainer contributor sponsor vendor contract deadline estimate schedule
""")

_EN_VERBS = _words("""
check fix run update add remove start stop restart deploy build test install upgrade rename
move copy delete create read write parse load save store fetch send receive handle retry cancel
close open merge rebase revert push pull clone commit review refactor debug profile measure
compare validate verify reproduce investigate inspect trace log monitor schedule queue process
convert encode decode compress extract filter sort search index migrate restore configure
enable disable expose hide wrap split join format render export import generate summarize
translate draft reply forward book confirm explain document support replace bump pin lock
unlock flush sync skip ignore catch raise return call invoke spawn kill wait poll resolve
reject accept approve drop map ship plan zip tag submit scan trim swap set get put cut begin
forget show rewrite throw feed keep hold find break take make lose leave bring think see
""")

_EN_ADJECTIVES = _words("""
slow fast broken stale empty missing duplicate invalid expired corrupted flaky stable unstable
large small huge tiny new old current previous next default custom local remote global internal
external public private async synchronous concurrent parallel nested recursive optional
required deprecated legacy experimental primary secondary readonly writable temporary
persistent cached compressed encrypted signed verified unverified pending active idle busy
healthy unhealthy intermittent random deterministic unexpected expected partial complete
incremental verbose quiet noisy clean dirty safe unsafe strict lenient raw normalized binary
textual orphaned dangling redundant obsolete noisy sparse dense hot cold warm blocking
""")

_EN_ADVERBS = _words("""
now already still again quickly slowly correctly properly silently randomly occasionally
consistently always never sometimes usually probably definitely actually currently previously
automatically manually explicitly implicitly immediately eventually rarely
""")

_EN_STOPWORDS = frozenset(
    """a an the and or but if then else of to in on at by for with from into onto as is are was
    were be been being it its this that these those there here so not no yes do does did done
    can could should would will shall may might must have has had i you he she we they me my
    your our their them us what which who whom when where why how all any each every some such
    than too very also just only now out up down over under again once about after before
    while per via let lets s t ll ve re d m don isn didn doesn couldn won wasn""".split()
)

# Identifier parts: verb_noun, verbNoun, ModifierNounSuffix.
_ID_VERBS = _words("""
get set load save parse build make create update delete fetch send handle process resolve
validate normalize format render encode decode compute apply register init reset flush open
close read write check find list sync merge split wrap emit dispatch schedule enqueue dequeue
acquire release retry ensure collect prune compact replay rewind archive restore migrate
""")
_ID_NOUNS = _words("""
session message token config state store db conn cursor row record entry item event task job
worker queue cache index query result response request payload header user profile account
agent tool skill prompt model context history summary chunk batch buffer stream file path dir
lock timeout error status handler callback hook plugin gateway channel chat thread platform
provider usage cost budget quota limit schema migration snapshot checkpoint lineage title
source origin delivery ledger admission transcript cwd branch reasoning attachment media
""")
_CLASS_MODIFIERS = _words("""
Async Base Default Local Remote Shared Cached Lazy Safe Atomic Streaming Pooled Scoped Abstract
Simple Composite Retrying Buffered Batched Durable
""")
_CLASS_SUFFIXES = _words("""
Manager Handler Client Server Service Store Factory Builder Adapter Provider Resolver Registry
Parser Formatter Validator Serializer Worker Runner Scheduler Queue Cache Error Exception Config
Options Settings State Result Context Monitor Policy Strategy Router Pool
""")

_PATH_DIRS = (
    "agent", "gateway", "gateway/platforms", "tools", "hermes_cli", "cron", "skills", "scripts",
    "environments", "acp_adapter", "tools/browser", "tools/environments", "web/src",
    "web/src/components", "web/src/hooks", "api", "src", "src/lib", "src/routes", "pkg/store",
    "internal/server", "cmd/cli", "deploy", "docs", "docs/guides", ".github/workflows",
)
_PATH_MODULES = _words("""
run config session models utils helpers state store client server main cli app routes
handlers schema migrations auth cache logger retry delivery telegram discord slack whatsapp
signal email scheduler jobs prompt_builder context_compressor model_tools terminal_tool
file_tools web_tools browser_tool memory_tool skills_tool approval display trajectory
batch_runner toolsets constants errors types index api db worker runtime registry commands
setup doctor status usage pricing redact title_generator insights hooks pairing mirror
""")
_EXTENSION_BY_DIR = {
    "web/src": ".ts", "web/src/components": ".tsx", "web/src/hooks": ".ts", "src": ".ts",
    "src/lib": ".ts", "src/routes": ".ts", "pkg/store": ".go", "internal/server": ".go",
    "cmd/cli": ".go", "deploy": ".yaml", ".github/workflows": ".yml", "docs": ".md",
    "docs/guides": ".md",
}
_PROJECTS = (
    "hermes-agent", "hermes-agent", "hermes-agent", "atlas-api", "infra", "dotfiles",
    "blog", "ledger-service", "scraper", "notebooks", "mobile-app", "data-pipeline",
)
_PACKAGES = _words("""
requests httpx aiohttp fastapi uvicorn pydantic sqlalchemy alembic pytest hypothesis numpy
pandas rich typer click openai anthropic tiktoken python-telegram-bot discord.py slack-bolt
playwright docker redis celery boto3 jinja2 pyyaml orjson uvloop prompt-toolkit tenacity
psutil websockets firecrawl-py exa-py fal-client elevenlabs edge-tts modal daytona honcho-ai
""")
_PYTHON_MODULES = _words("""
os sys json re time asyncio logging sqlite3 pathlib typing dataclasses subprocess shutil
threading contextlib functools itertools collections uuid hashlib base64 tempfile signal
""")
_PLATFORMS = ("telegram", "discord", "slack", "whatsapp", "signal", "email", "matrix", "sms")
_PLACES = _words("""
Berlin Tokyo London Paris Lisbon Seoul Singapore Toronto Austin Denver Chicago Boston
Amsterdam Madrid Warsaw Sydney Melbourne Auckland Nairobi Lagos Dubai Mumbai Bangalore
""")
_DOMAINS = (
    "github.com", "docs.python.org", "stackoverflow.com", "sqlite.org", "developer.mozilla.org",
    "news.ycombinator.com", "arxiv.org", "pypi.org", "en.wikipedia.org", "openrouter.ai",
    "platform.openai.com", "docs.anthropic.com", "huggingface.co", "www.reddit.com",
    "blog.cloudflare.com", "kubernetes.io", "docs.docker.com", "www.postgresql.org",
    "fastapi.tiangolo.com", "www.nytimes.com", "www.bbc.co.uk", "weather.com",
)
_USERS = ("alex", "sam", "dev", "ubuntu", "root", "mira", "kenji", "jiwoo", "lin")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_LOG_LEVELS = ("INFO", "INFO", "INFO", "INFO", "DEBUG", "DEBUG", "WARNING", "ERROR")
_HTTP_METHODS = ("GET", "GET", "GET", "POST", "POST", "PUT", "PATCH", "DELETE")
_HTTP_STATUSES = (200, 200, 200, 201, 204, 301, 400, 401, 403, 404, 409, 422, 429, 500, 502)
_PORTS = (3000, 5000, 5173, 5432, 6379, 8000, 8080, 8443, 8642, 9090, 11434)
_PY_TYPES = (
    "str", "int", "float", "bool", "bytes", "None", "list[str]", "dict[str, Any]", "Path",
    "sqlite3.Connection", "str | None", "int | None", "Sequence[str]", "Mapping[str, Any]",
)
_TS_TYPES = ("string", "number", "boolean", "string[]", "Record<string, unknown>", "Date")
_GO_TYPES = ("string", "int", "int64", "bool", "[]byte", "time.Time", "error", "[]string")

_IRREGULAR_VERBS = {
    "run": ("ran", "run"), "write": ("wrote", "written"), "build": ("built", "built"),
    "find": ("found", "found"), "get": ("got", "got"), "set": ("set", "set"),
    "read": ("read", "read"), "send": ("sent", "sent"), "make": ("made", "made"),
    "take": ("took", "taken"), "break": ("broke", "broken"), "begin": ("began", "begun"),
    "keep": ("kept", "kept"), "hold": ("held", "held"), "split": ("split", "split"),
    "show": ("showed", "shown"), "rewrite": ("rewrote", "rewritten"), "put": ("put", "put"),
    "catch": ("caught", "caught"), "cut": ("cut", "cut"), "lose": ("lost", "lost"),
    "leave": ("left", "left"), "bring": ("brought", "brought"), "think": ("thought", "thought"),
    "see": ("saw", "seen"), "forget": ("forgot", "forgotten"), "hide": ("hid", "hidden"),
    "feed": ("fed", "fed"), "throw": ("threw", "thrown"),
}
_DOUBLING_VERBS = frozenset(
    "stop drop commit skip log map ship plan wrap zip pin tag submit scan trim swap run set "
    "get put cut begin forget debug".split()
)

# --- Chinese ---------------------------------------------------------------------------------
_ZH_NOUNS = _words("""
数据库 服务器 配置 日志 错误 文件 目录 代码 函数 变量 接口 请求 响应 用户 会话 消息 任务 进程
线程 内存 磁盘 网络 端口 域名 证书 密钥 令牌 权限 账号 密码 版本 分支 仓库 依赖 模块 插件 框架
脚本 命令 参数 选项 环境 容器 镜像 集群 节点 队列 缓存 索引 表格 字段 记录 事务 超时 异常 警告
用例 报告 文档 注释 格式 编码 字符串 数组 对象 类型 结构 算法 性能 速度 延迟 带宽 流量 负载
资源 成本 费用 预算 时间 日期 时区 天气 新闻 市场 股票 价格 客户 产品 项目 需求 问题 方案 计划
会议 邮件 通知 页面 按钮 窗口 界面 图片 视频 音频 模型 推理 提示词 上下文 向量 机器人 助手 工具
浏览器 终端 结果 链接 网站 公司 团队 同事 老板 平台 频道 群组 附件 截图 语言 中文 英文 摘要
标题 内容 关键词 搜索引擎 服务 后台 前端 后端 测试环境 生产环境 开发环境 环境变量 配置文件
日志文件 单元测试 集成测试 错误处理 版本控制 内存泄漏 数据结构 网络请求 用户界面 代码审查
持续集成 依赖冲突 并发控制 权限管理 接口文档 数据迁移 缓存失效 定时任务 消息队列 负载均衡
性能优化 系统监控 安全漏洞 自动部署 命令行 数据包 防火墙 操作系统 虚拟机 数据表 主键 外键
哈希 签名 回调 钩子 事件 中间件 路由 协议 握手 心跳 限流 熔断 快照 归档 压缩包 安装包 补丁
分页 批量 线程池 连接池 调度器 工作流 知识库 向量库 嵌入模型 检索结果 对话记录 历史消息
""")
_ZH_VERBS = _words("""
部署 检查 修改 更新 删除 创建 重启 测试 调试 优化 配置 安装 卸载 编译 运行 提交 合并 回滚
备份 恢复 迁移 监控 分析 处理 解析 加载 保存 读取 写入 发送 接收 导入 导出 启动 停止 重构
验证 同步 查询 搜索 下载 上传 替换 清理 压缩 翻译 总结 记录 排查 修复 升级 发布 注册 登录
订阅 授权 过滤 排序 统计 复现 整理 打包 生成 计算 比较 确认 调整 实现 设计 封装 拆分 简化
补充 定位 跟踪 观察 评估 预览
""")
_ZH_STATES = _words("""
很慢 正常 失败了 成功了 不稳定 报错了 卡住了 崩溃了 超时了 变慢了 没有反应 重复了 丢失了
过期了 太大了 太小了 不一致 有问题 没问题 可以用了 不能用 很奇怪 很复杂 很简单 已经修好了
还在排查
""")
_ZH_ADVERBS = _words("""
已经 还是 一直 经常 偶尔 突然 马上 暂时 大概 其实 终于 仍然 总是 刚才 今天 昨天 明天 最近
""")
_ZH_PLACES = _words("北京 上海 深圳 杭州 广州 成都 南京 武汉 东京 香港 台北 新加坡")
_ZH_HEADINGS = ("总结", "原因", "解决方案", "步骤", "修改内容", "注意事项", "下一步", "测试结果")

# --- Japanese --------------------------------------------------------------------------------
_JA_NOUNS = _words("""
データベース サーバー 設定 ログ エラー ファイル ディレクトリ コード 関数 変数 リクエスト
レスポンス ユーザー セッション メッセージ タスク プロセス スレッド メモリ ディスク
ネットワーク ポート ドメイン 証明書 鍵 トークン 権限 アカウント パスワード バージョン
ブランチ リポジトリ 依存関係 モジュール プラグイン フレームワーク スクリプト コマンド 引数
オプション 環境 コンテナ イメージ クラスタ ノード キュー キャッシュ インデックス テーブル
カラム レコード トランザクション タイムアウト 例外 警告 テスト 結果 報告 資料 コメント 形式
文字コード 文字列 配列 オブジェクト 型 構造 性能 速度 遅延 負荷 資源 費用 予算 時間 日付
時刻 天気 ニュース 株価 価格 顧客 製品 案件 要件 問題 対策 計画 会議 メール 通知 画面 ボタン
画像 動画 音声 モデル 推論 プロンプト 文脈 ベクトル ボット アシスタント ツール ブラウザ
ターミナル 検索 リンク サイト 会社 チーム 同僚 上司 部署 担当者 仕様 議事録 見積 請求書 契約
手順 原因 影響 対応 改善 障害 本番環境 開発環境 検証環境 環境変数 設定変更 動作確認 性能改善
単体テスト 結合テスト 負荷試験 障害対応 原因調査 運用手順 定期実行 自動化 日本語 英語 翻訳
要約 題名 内容 キーワード 管理画面 本番 仕組み 入力 出力 一覧 詳細 履歴 状態 接続 認証
暗号化 署名 同期 非同期 並列 排他制御 再試行 差分 変更点 修正 不具合 デプロイ コミット マージ
レビュー ログイン 設定ファイル 作業ログ 会話履歴 知識ベース 埋め込み 検索結果 文字化け
""")
_JA_VERBS = _words("""
確認 設定 修正 更新 削除 作成 再起動 実行 調査 最適化 導入 変更 追加 移行 監視 分析 処理
解析 保存 送信 受信 取得 起動 停止 検証 同期 検索 共有 置換 整理 圧縮 翻訳 要約 記録 調整
実装 設計 比較 計算 生成 公開 登録 復元 削減 対応 報告 相談 説明 準備 反映 適用 再現 特定
""")
_JA_STATES = _words("""
遅いです 正常です 失敗しました 成功しました 不安定です 止まっています 落ちました
応答がありません 重複しています 見つかりません 期限切れです 大きすぎます 一致しません
おかしいです 問題ありません 使えません 複雑です 簡単です 直りました 調査中です
""")
_JA_ADVERBS = _words("""
すでに まだ ずっと ときどき 急に すぐに 一時的に たぶん 実は やっと 常に さっき 今日 昨日
明日 最近 念のため
""")
_JA_PLACES = _words("東京 大阪 京都 名古屋 福岡 札幌 横浜 神戸 仙台 渋谷 新宿 品川")
_JA_HEADINGS = ("まとめ", "原因", "対応", "手順", "変更点", "注意点", "次のステップ", "テスト結果")

# --- Korean ----------------------------------------------------------------------------------
_KO_NOUNS = _words("""
데이터베이스 서버 설정 로그 오류 파일 디렉토리 코드 함수 변수 인터페이스 요청 응답 사용자
세션 메시지 작업 프로세스 스레드 메모리 디스크 네트워크 포트 도메인 인증서 키 토큰 권한 계정
비밀번호 버전 브랜치 저장소 의존성 모듈 플러그인 프레임워크 스크립트 명령어 인자 옵션 환경
컨테이너 이미지 클러스터 노드 큐 캐시 인덱스 테이블 컬럼 레코드 트랜잭션 타임아웃 예외 경고
테스트 결과 보고서 문서 주석 형식 인코딩 문자열 배열 객체 타입 구조 알고리즘 성능 속도 지연
대역폭 트래픽 부하 자원 비용 예산 시간 날짜 시간대 날씨 뉴스 주가 가격 고객 제품 프로젝트
요구사항 문제 해결책 계획 회의 이메일 알림 페이지 버튼 화면 사진 동영상 음성 모델 추론
프롬프트 문맥 벡터 봇 비서 도구 브라우저 터미널 검색 링크 사이트 회사 팀 동료 팀장 담당자
일정 원인 영향 대응 개선 장애 운영환경 개발환경 테스트환경 환경변수 설정파일 로그파일
단위테스트 통합테스트 오류처리 버전관리 메모리누수 자료구조 코드리뷰 지속통합 배포환경 서버설정
성능개선 대시보드 파이프라인 워크플로우 라이브러리 클라이언트 타임스탬프 체크포인트 스냅샷
백업 마이그레이션 한국어 영어 번역 요약 제목 내용 키워드 관리자 상태 연결 인증 암호화 서명
동기화 비동기 병렬 재시도 변경사항 수정 버그 배포 커밋 리뷰 로그인 대화기록 검색결과 임베딩
""")
_KO_VERBS = _words("""
확인 설정 수정 업데이트 삭제 생성 재시작 실행 조사 최적화 도입 변경 추가 이전 모니터링 분석
처리 파싱 저장 전송 수신 조회 시작 중지 검증 동기화 검색 공유 교체 정리 압축 번역 요약 기록
조정 구현 설계 비교 계산 배포 등록 복구 대응 보고 설명 준비 반영 적용 재현 테스트 리팩터링
디버깅 점검
""")
_KO_STATES = _words("""
느려요 정상이에요 실패했어요 성공했어요 불안정해요 멈췄어요 죽었어요 응답이_없어요
중복돼요 안_보여요 만료됐어요 너무_커요 일치하지_않아요 이상해요 문제없어요 안_돼요
복잡해요 간단해요 고쳐졌어요 확인_중이에요
""")
_KO_ADVERBS = _words("""
이미 아직 계속 가끔 갑자기 바로 일시적으로 아마 사실 드디어 항상 방금 오늘 어제 내일 요즘
""")
_KO_PLACES = _words("서울 부산 인천 대구 대전 광주 판교 제주 수원 강남 성수 여의도")
_KO_HEADINGS = ("요약", "원인", "해결 방법", "진행 순서", "변경 사항", "주의할 점", "다음 단계")


def _hangul_final(word: str) -> bool:
    """Whether the last syllable of ``word`` has a final consonant (picks 을/를, 은/는, 이/가)."""
    last = word[-1]
    if "\uac00" <= last <= "\ud7a3":
        return (ord(last) - 0xAC00) % 28 != 0
    return False


# ---------------------------------------------------------------------------------------------
# Templates: ``{slot}`` is filled by the picker of that name; a trailing digit makes a second,
# independent draw (``{n2}``). Literal braces are fine as long as no [a-z_] follows them.
# ---------------------------------------------------------------------------------------------

_SLOT_RE = re.compile(r"\{([a-z_]+?)\d*\}")

_EN_PROSE = (
    "I {ved} the {n} in `{path}` so the {n2} now {vs} {adv}.",
    "The {a} {n} {vs} the {n2} before the {n3} is {ven}.",
    "It looks like `{id}` {vs} a {a} {n} when the {n2} is {a2}.",
    "I'll {v} the {n} first and then {v2} the {n2}.",
    "The failing test was `{test}`; it {ved} because the {n} was {a}.",
    "After the change, `{cmd}` finishes in {dur} instead of {dur2}.",
    "`{cls}` now {vs} the {n} through `{id}`.",
    "The root cause is `{err}` raised from `{id}` in `{path}`.",
    "There are {int} {ns} left in the {n2}, so the {n3} {vs} {adv}.",
    "I {adv} {ved} the {a} {n} from `{id}`.",
    "You can {v} the {n} with `{cmd}`.",
    "This keeps the {n} {a} while the {n2} {vs}.",
    "The {n} should only {v} the {n2} when `{id}` returns {val}.",
    "See {url} for the {a} {n} behaviour.",
    "The {n} limit is {int} per {n2}, and we are at {pct}.",
    "Nothing else in `{path}` {vs} the {n}.",
    "I couldn't {v} the {n}: `{err}`.",
    "Both `{id}` and `{id2}` {v} the same {n}, which is why the {n2} is {a}.",
    "Version {ver} of {pkg} {ved} the {n} API.",
    "The {n} on port {port} answers with HTTP {status}.",
    "Let me know if you want me to {v} the {n} as well.",
    "I added a {a} {n} for `{id}` in `{path}`.",
    "The {n} in {place} {vs} {adv}, so I {ved} the {n2}.",
    "Once the {n} is {ven}, {v} the {n2} again.",
    "{ving_cap} the {n} takes {dur} on a {a} {n2}.",
    "The {a} {ns} are {ven} by `{cls}`, not by the {n}.",
    "`{id}` was {ven} {adv}, which left the {n} {a}.",
    "I would not {v} the {n} here: the {n2} is {a} and the {n3} {vs} it.",
    "Every {n} now has a {a} {n2}, and `{id}` {vs} it on {n3}.",
    "The {n} grew from {int} to {int2} {ns} after {ving} the {n2}.",
    "The logs show {int} {ns} {ven} between {time} and {time2}.",
    "{pkg} {ver} {vs} the {n} {adv}; pin it until the {n2} is {ven}.",
    "I {ved} `{cmd}` and it {ved2} the {a} {n}.",
    "The {n} and the {n2} disagree about the {n3}.",
    "Keeping the {n} {a} avoids {ving} the {n2} twice.",
)

_EN_USER = (
    "Can you {v} the {n} in `{path}`?",
    "Why does `{id}` {v} the {n} {adv}?",
    "The {n} is {a} again, please {v} it.",
    "I'm getting `{err}` when I run `{cmd}`.",
    "Please {v} the {a} {n} and {v2} the {n2}.",
    "What's the best way to {v} a {n} with {pkg}?",
    "{v_cap} the {n} for {place} and send me a {n2}.",
    "Check {url} and {v} the {n}.",
    "Is `{cls}` still used anywhere?",
    "Make `{id}` {v} the {n} before it {vs} the {n2}.",
    "Run the tests in `{testpath}` and tell me what fails.",
    "Also {v} the {n} so that the {n2} stays {a}.",
    "Find out why the {n} on {host} is {a}.",
    "Draft a {n} to the {n2} team about the {a} {n3}.",
    "Summarize the {n} from {url}.",
    "Can you {v} {pkg} to {ver}?",
    "Use `{id}` instead of `{id2}` here.",
    "How many {ns} does the {n2} {v} per {n3}?",
    "Look at the {n} in `{path}` around line {line}.",
    "Thanks, now {v} the {n} too.",
    "The {n} has been {a} since {time}, any idea why?",
    "Don't {v} the {n}, just {v2} the {n2}.",
    "What changed in the {n} between {ver} and {ver2}?",
)

_EN_PREFACE = (
    "Let me check `{path}` first.",
    "I'll look at the {n} before changing anything.",
    "Running the tests to see where the {n} {vs}.",
    "Searching for `{id}` across the repo.",
    "Let me read the {n} and the {n2}.",
    "Checking the logs for the {a} {n}.",
    "I'll {v} the {n} now.",
    "Looking up {pkg} {ver}.",
)

_EN_REASONING = (
    "The user wants me to {v} the {n} in {path}.",
    "I should check {path} before touching the {n}.",
    "Maybe the {n} {vs} before the {n2} is {ven}.",
    "The {err} suggests the {n} is {a}.",
    "If `{id}` {vs} the {n}, the {n2} would be {a}.",
    "I need to {v} the {n} without {ving} the {n2}.",
    "The previous output shows {int} {ns}, which is {a}.",
    "Wait, the {n} was already {ven} by `{id}`.",
    "Let me think about whether {ving} the {n} is {a}.",
    "The simplest fix is to {v} the {n} in `{id}`.",
    "Hmm, {cmd} returned exit code {exit}, so the {n} {ved}.",
)

_ZH_PROSE = (
    "{n}的{n2}{adv}{st}。",
    "请帮我{v}一下{n}。",
    "我在{place}{v}{n}的时候遇到了 `{err}`。",
    "这个{n}{adv}{st}，需要{v}{n2}。",
    "先{v}{n}，然后{v2}{n2}。",
    "为什么{n}会{st}？",
    "运行 `{cmd}` 以后，{n}还是{st}。",
    "我已经把{n}{v}好了，{n2}现在是 {int}。",
    "`{path}` 里的 `{id}` 负责{v}{n}。",
    "可以把{n}和{n2}{v}到一起吗？",
    "根据{n}，{n2}的{n3}大概是 {int}。",
    "我觉得问题出在{n}上，{n2}{adv}{st}。",
    "{n}已经{v}完成，一共处理了 {int} 条{n2}。",
    "能不能用 `{id}` 来{v}{n}？",
    "{place}的{n}{adv}{st}，我去{v}一下。",
    "下一步需要{v}{n}，并且{v2}{n2}。",
    "如果{n}{st}，就{v}{n2}。",
    "注意不要同时{v}{n}和{n2}。",
    "{n}的{n2}在 `{path}` 里，{v}之后要重启{n3}。",
    "这次{v}的{n}比上次多了 {pct}。",
    "请把{n}{v}成{n2}，再{v2}到{place}的{n3}。",
    "我{adv}{v}了{n}，但是{n2}{st}。",
)
_ZH_PREFACE = ("我先看一下 `{path}`。", "先{v}一下{n}。", "我来搜索 `{id}` 的用法。",
               "先跑一下测试看看{n}。", "我查一下{n}的日志。")

_JA_PROSE = (
    "{n}の{n2}が{adv}{st}。",
    "{n}を{v}してください。",
    "`{path}` の `{id}` で `{err}` が発生しました。",
    "まず{n}を{v}して、次に{n2}を{v2}します。",
    "{n}について教えてください。",
    "`{cmd}` を実行したところ、{n}が{st}。",
    "{n}は{v}済みで、{n2}は {int} になりました。",
    "{place}の{n}を{v}したいです。",
    "{n}と{n2}の違いは何ですか？",
    "原因は{n}の{n2}だと思います。",
    "{n}の{v}が終わったら{n2}を{v2}してください。",
    "{adv}{n}を{v}しておきました。",
    "この{n}は `{id}` で{v}しています。",
    "{n}が{st}ので、{n2}を{v}する必要があります。",
    "念のため{n}も{v}しました。",
    "{place}の{n}は{adv}{st}。",
    "`{path}` の{n}を{v}すると{n2}が{st}。",
    "{n}の件数は {int} 件で、前回より {pct} 増えました。",
    "{n}と{n2}を{v}した結果をまとめます。",
    "{n}の{n2}を{v}してから{n3}を{v2}しました。",
)
_JA_PREFACE = (
    "まず `{path}` を確認します。", "{n}を{v}します。", "`{id}` の使用箇所を検索します。",
    "テストを実行して{n}を確認します。", "{n}のログを見てみます。",
)

_KO_PROSE = (
    "{n}의 {n_i} {adv} {st}.",
    "{n_eul} {v}해 주세요.",
    "`{path}` 에서 `{id}` 실행 중에 `{err}` 오류가 발생했어요.",
    "먼저 {n_eul} {v}하고, 그다음에 {n_eul2} {v2}할게요.",
    "{n}에 대해 알려 주세요.",
    "`{cmd}` 실행 후에도 {n_i} {st}.",
    "{n_eun} 이미 {v}했고, {n_eun2} 현재 {int}개예요.",
    "{place}의 {n_eul} {v}하고 싶어요.",
    "{n_wa} {n2}의 차이가 뭐예요?",
    "원인은 {n}의 {n2}인 것 같아요.",
    "{n} {v} 작업이 끝나면 {n_eul} {v2}해 주세요.",
    "{adv} {n_eul} {v}해 두었어요.",
    "이 {n_eun} `{id}`에서 {v}하고 있어요.",
    "{n_i} {st}. 그래서 {n_eul} {v}해야 해요.",
    "혹시 몰라서 {n}도 {v}했어요.",
    "{place} {n_i} {adv} {st}.",
    "`{path}`의 {n_eul} {v}하면 {n_i} {st}.",
    "{n} 건수는 {int}건이고, 지난번보다 {pct} 늘었어요.",
    "{n_wa} {n_eul2} {v}한 결과를 정리할게요.",
    "{n}의 {n_eul} {v}한 다음에 {n_eul2} {v2}했어요.",
)
_KO_PREFACE = ("먼저 `{path}`를 확인할게요.", "{n_eul} {v}할게요.", "`{id}` 사용처를 검색할게요.",
               "테스트를 실행해서 {n_eul} 확인할게요.", "{n} 로그를 볼게요.")

# Pre-rendered pools of strings that other templates refer to as a single slot.
_ERROR_TEMPLATES = (
    "sqlite3.OperationalError: database is locked",
    "sqlite3.OperationalError: no such column: {snake}",
    "sqlite3.IntegrityError: UNIQUE constraint failed: {snake}.{snake2}",
    "KeyError: '{snake}'",
    "TypeError: {snake}() got an unexpected keyword argument '{snake2}'",
    "AttributeError: 'NoneType' object has no attribute '{snake}'",
    "AttributeError: '{cls}' object has no attribute '{snake}'",
    "ValueError: invalid literal for int() with base 10: '{word}'",
    "ModuleNotFoundError: No module named '{module}'",
    "FileNotFoundError: [Errno 2] No such file or directory: '{path}'",
    "PermissionError: [Errno 13] Permission denied: '{path}'",
    "ConnectionRefusedError: [Errno 111] Connection refused",
    "ConnectionResetError: [Errno 104] Connection reset by peer",
    "TimeoutError: {snake} timed out after {int}s",
    "json.decoder.JSONDecodeError: Expecting value: line 1 column {int} (char {int2})",
    "httpx.ReadTimeout: The read operation timed out",
    "openai.RateLimitError: Error code: 429 - rate limit exceeded for {model}",
    "RuntimeError: Event loop is closed",
    "UnicodeDecodeError: 'utf-8' codec can't decode byte 0x{hexbyte} in position {int}",
    "AssertionError: assert {int} == {int2}",
    "IndexError: list index out of range",
    "RecursionError: maximum recursion depth exceeded while calling {snake}",
    "OSError: [Errno 28] No space left on device",
    "ssl.SSLCertVerificationError: certificate verify failed: unable to get local issuer",
    "TypeError: Cannot read properties of undefined (reading '{camel}')",
    "panic: runtime error: invalid memory address or nil pointer dereference",
    "Error: listen EADDRINUSE: address already in use :::{port}",
    "fatal: not a git repository (or any of the parent directories): .git",
    "error: failed to push some refs to 'origin/{branch}'",
    "npm ERR! code ERESOLVE could not resolve dependency {module}",
    "HTTP {status}: {cls} rejected the request",
    "telegram.error.NetworkError: httpx.ConnectError: [Errno -3] Temporary failure",
    "discord.errors.HTTPException: 429 Too Many Requests (error code: 0)",
    "{cls}: {snake} is {adj}",
)
_COMMAND_TEMPLATES = (
    "pytest {testpath} -q",
    "pytest -x -k {snake} {testpath}",
    "python -m pytest tests/ -q --maxfail=3",
    "git status --short",
    "git log --oneline -n 20",
    "git diff {path}",
    "git checkout -b fix/{kebab}",
    "rg -n '{snake}' {dir}",
    "grep -rn \"{camel}\" {dir}",
    "ls -la {dir}",
    "python -m {module} --help",
    "pip install {pkg}=={ver}",
    "npm run build",
    "docker compose logs --tail 200 {service}",
    "tail -n 200 logs/{service}.log",
    "curl -s http://localhost:{port}/api/{snake}/{int} | jq .",
    "sqlite3 state.db 'PRAGMA integrity_check;'",
    "du -sh {dir}",
    "ps aux | grep {service}",
    "systemctl status {service}",
    "journalctl -u {service} --since '1 hour ago'",
    "make test",
    "go test ./...",
    "uv run pytest {testpath}",
    "python scripts/{snake}.py --dry-run",
    "hermes sessions list --limit {int}",
)
_URL_TEMPLATES = (
    "https://{domain}/{kebab}",
    "https://{domain}/{kebab}/{kebab2}",
    "https://github.com/{user}/{project}/issues/{int}",
    "https://github.com/{user}/{project}/pull/{int}",
    "https://{domain}/questions/{int}/{kebab}",
    "https://{domain}/docs/{kebab}#{kebab2}",
    "https://pypi.org/project/{pkg}/{ver}/",
)

_PY_LINE_TEMPLATES = (
    "def {snake}(self, {snake2}: {pytype}) -> {pytype2}:",
    "def {snake}({snake2}, *, {snake3}: {pytype} = None) -> {pytype2}:",
    "async def {snake}(self, {snake2}: {pytype}) -> {pytype2}:",
    "    {snake} = self.{snake2}({snake3})",
    "    {snake} = {snake2}.get(\"{snake3}\")",
    "    if {snake} is None:",
    "    if not {snake}:",
    "        raise {cls}(f\"{comment}\")",
    "    return {snake}",
    "        return None",
    "import {module}",
    "from {modpath} import {cls}, {snake}",
    "    # {comment}",
    "class {cls}({cls2}):",
    "    \"\"\"{comment_cap}.\"\"\"",
    "        for {snake} in self.{snake2}:",
    "            {snake}.{snake2}()",
    "    logger.{level}(\"{comment}: %s\", {snake})",
    "    await self.{snake}({snake2}, timeout={int})",
    "    {snake}: {pytype} = field(default_factory={container})",
    "@pytest.mark.parametrize(\"{snake}\", [{int}, {int2}, {int3}])",
    "def test_{snake}({snake2}, tmp_path):",
    "    assert {snake}.{snake2}() == {int}",
    "    with {snake}.transaction() as conn:",
    "        conn.execute(\"SELECT {snake} FROM {snake2} WHERE {snake3} = ?\", ({snake4},))",
    "    except {errtype} as exc:",
    "        logger.warning(\"{comment}\", exc_info=exc)",
    "    {snake} = os.environ.get(\"{upper}\", \"{snake2}\")",
    "    return {\"{snake}\": {snake}, \"{snake2}\": {snake3}}",
    "",
    "",
)
_TS_LINE_TEMPLATES = (
    "export async function {camel}({camel2}: {tstype}): Promise<{tstype2}> {",
    "  const {camel} = await {camel2}({camel3});",
    "  if (!{camel}) {",
    "    throw new Error(`{comment}`);",
    "  }",
    "  return {camel};",
    "}",
    "import { {cls} } from \"./{module}\";",
    "export interface {cls} {",
    "  {camel}: {tstype};",
    "  {camel}?: {tstype} | null;",
    "  // {comment}",
    "  const [{camel}, {camel2}] = useState<{tstype}>();",
    "      <Button onClick={() => {camel}()}>{comment_cap}</Button>",
    "",
)
_GO_LINE_TEMPLATES = (
    "func (s *{cls}) {pascal}(ctx context.Context, {camel} string) error {",
    "\tif err := s.{camel}(ctx); err != nil {",
    "\t\treturn fmt.Errorf(\"{comment}: %w\", err)",
    "\t}",
    "\treturn nil",
    "}",
    "type {cls} struct {",
    "\t{pascal} {gotype} `json:\"{snake}\"`",
    "\t// {comment}",
    "",
)
_CONFIG_LINE_TEMPLATES = (
    "{snake}:",
    "  {snake}: {int}",
    "  {snake}: {snake2}",
    "  - {snake}",
    "  timeout_seconds: {int}",
    "  url: {url}",
    "  model: {model}",
    "# {comment}",
    "{upper}={snake}",
)
_LOG_MESSAGE_TEMPLATES = (
    "{comment}",
    "{ved} {snake} {hex} in {int}ms",
    "retrying {snake} after {err} (attempt {small}/5)",
    "{method} /api/{snake}/{int} {status} {int2}ms",
    "session {hex} {ved} ({int} messages)",
    "{platform} adapter {ved}: {comment}",
    "cache hit ratio {pct} for {snake}",
    "queue depth {int} on {snake}",
    "{cls} {ved} {int} {snake} rows",
)
_TEST_LINE_TEMPLATES = (
    "{testpath}::test_{snake} PASSED{pad}[{pctw}]",
    "{testpath}::test_{snake} PASSED{pad}[{pctw}]",
    "{testpath}::test_{snake} PASSED{pad}[{pctw}]",
    "{testpath}::test_{snake}[{snake2}] PASSED{pad}[{pctw}]",
    "{testpath}::test_{snake} FAILED{pad}[{pctw}]",
    "{testpath}::test_{snake} SKIPPED ({comment}){pad}[{pctw}]",
    "E       {err}",
    "E       assert {int} == {int2}",
    "{path}:{line}: {errtype}",
)
_GIT_LINE_TEMPLATES = (
    "{hex} {verb_cap} {noun} in {module}",
    "{hex} {verb_cap} {adj} {noun} handling for {snake}",
    "{hex} Merge pull request #{int} from {user}/{kebab}",
    " M {path}",
    "?? {path}",
    "+    {snake} = {snake2}({snake3})",
    "-    {snake} = self.{snake2}",
    "     return {snake}",
    "@@ -{int},{small} +{int2},{small2} @@ def {snake}(",
    " {path} | {small}{small2} {plusminus}",
)
_LISTING_LINE_TEMPLATES = (
    "-rw-r--r--  1 {user} staff  {int} {month} {day} {clock} {module}.py",
    "-rw-r--r--  1 {user} staff  {int} {month} {day} {clock} {snake}.json",
    "drwxr-xr-x  {small} {user} staff  {int} {month} {day} {clock} {snake}",
    "lrwxr-xr-x  1 {user} staff  {small} {month} {day} {clock} {snake} -> ../{snake2}",
    "{int}K\t{dir}",
)
_INSTALL_LINE_TEMPLATES = (
    "Collecting {pkg}=={ver}",
    "  Downloading {pkg}-{ver}-py3-none-any.whl ({int} kB)",
    "Requirement already satisfied: {pkg} in ./.venv/lib/python3.11/site-packages ({ver})",
    "Successfully installed {pkg}-{ver} {pkg2}-{ver2}",
    "Building wheel for {pkg} (pyproject.toml): finished with status 'done'",
    "{hex}   {service}:{ver}   \"{module}\"   {small} hours ago   Up {small2} hours",
    "Step {small}/{small2} : RUN pip install --no-cache-dir {pkg}",
)
_GREP_LINE_TEMPLATES = (
    "{path}:{line}:    {snake} = {snake2}({snake3})",
    "{path}:{line}:def {snake}({snake2}):",
    "{path}:{line}:from {modpath} import {cls}",
    "{path}:{line}:    # {comment}",
    "{path}:{line}:        raise {cls}(\"{comment}\")",
)
_TRACE_TEMPLATES = (
    "  File \"{root}/{path}\", line {line}, in {snake}\n    {snake2} = self.{snake3}({snake4})",
    "  File \"{root}/{path}\", line {line}, in {snake}\n    return await {snake2}({snake3})",
    "  File \"/usr/lib/python3.11/{module}.py\", line {line}, in {snake}\n    raise {errtype}",
)
_SNAPSHOT_TEMPLATES = (
    "- heading \"{title}\" [level=2] [ref=e{int}]",
    "- link \"{noun_cap} {noun}\" [ref=e{int}]",
    "- button \"{verb_cap}\" [ref=e{int}]",
    "- textbox \"{noun_cap}\" [ref=e{int}]",
    "- listitem: {comment_cap}",
    "- paragraph: {sentence}",
)
_EN_TITLE_TEMPLATES = (
    "How to {verb} a {noun} with {pkg}",
    "{cls} — {adj} {noun} in {pkg} {ver}",
    "{verb_cap} {noun}: {comment}",
    "Why is my {noun} {adj}?",
    "{noun_cap} {noun2} guide ({year})",
)


# ---------------------------------------------------------------------------------------------
# Vocabulary: word draws and pre-rendered pools
# ---------------------------------------------------------------------------------------------

Picker = Callable[[], str]


class _Zipf:
    """Draws from ``items`` with weight ``1 / (rank + 2) ** exponent``."""

    __slots__ = ("cum", "items", "total")

    def __init__(self, items: Sequence[Any], exponent: float = 1.0) -> None:
        self.items = tuple(items)
        self.cum = list(itertools.accumulate(1.0 / (i + 2) ** exponent for i in range(len(items))))
        self.total = self.cum[-1]

    def pick(self, r: random.Random) -> Any:
        i = bisect.bisect_right(self.cum, r.random() * self.total)
        return self.items[min(i, len(self.items) - 1)]


def _plural(noun: str) -> str:
    if noun.endswith(("s", "x", "sh", "ch", "z")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u"):
        return noun[:-1] + "ies"
    return noun + "s"


def _verb_forms(verb: str) -> tuple[str, str, str, str, str]:
    """(base, third person, past, participle, gerund)."""
    third = _plural(verb)
    doubled = verb + verb[-1] if verb in _DOUBLING_VERBS else verb
    if verb in _IRREGULAR_VERBS:
        past, participle = _IRREGULAR_VERBS[verb]
    elif verb.endswith("e"):
        past = participle = verb + "d"
    elif verb.endswith("y") and verb[-2] not in "aeiou":
        past = participle = verb[:-1] + "ied"
    else:
        past = participle = doubled + "ed"
    if verb.endswith("e") and not verb.endswith("ee"):
        gerund = verb[:-1] + "ing"
    else:
        gerund = doubled + "ing"
    return verb, third, past, participle, gerund


def _compile(template: str) -> tuple[str, ...]:
    return tuple(_SLOT_RE.split(template))


def _render(parts: tuple[str, ...], pick: dict[str, Picker]) -> str:
    out = list(parts)
    for i in range(1, len(out), 2):
        out[i] = pick[out[i]]()
    return "".join(out)


def _avg_bytes(pool: Sequence[str]) -> float:
    return max(1.0, sum(len(s.encode()) + 1 for s in pool) / len(pool))


@dataclass(frozen=True, slots=True)
class _Pool:
    """Pre-rendered strings and their mean UTF-8 size (newline included)."""

    items: tuple[str, ...]
    avg: float

    @classmethod
    def of(cls, items: Iterable[str]) -> _Pool:
        items = tuple(items)
        return cls(items, _avg_bytes(items))

    def lines(self, r: random.Random, size: int) -> str:
        """About ``size`` UTF-8 bytes of lines: runs of up to ``_RUN`` consecutive pool items
        from random places (one draw per run rather than per line; the pool order is random).
        """
        items = self.items
        wanted = max(1, int(size / self.avg))
        span = len(items) - _RUN
        picked: list[str] = []
        while wanted > 0:
            take = min(wanted, _RUN)
            start = int(r.random() * span)
            picked += items[start : start + take]
            wanted -= take
        return "\n".join(picked)


class _Vocab:
    """Everything the corpus draws from; built once per process from a fixed seed."""

    def __init__(self) -> None:
        r = random.Random("hermes-bench-vocabulary")
        self.nouns = _Zipf(_EN_NOUNS)
        self.verbs = _Zipf([_verb_forms(v) for v in _EN_VERBS])
        self.adjectives = _Zipf(_EN_ADJECTIVES)
        self.adverbs = _Zipf(_EN_ADVERBS)
        self.snakes = _Zipf(self._snake_identifiers(r), 0.9)
        self.camels = _Zipf(self._camel_identifiers(r), 0.9)
        self.classes = _Zipf(self._class_names(r), 0.9)
        self.paths = _Zipf(self._paths(r), 0.9)
        self.test_paths = _Zipf(self._test_paths(r), 0.9)
        self.packages = _Zipf(_PACKAGES)
        self.places = _Zipf(_PLACES)
        self.words: dict[str, tuple[_Zipf, _Zipf, _Zipf, _Zipf, _Zipf]] = {
            "zh": (_Zipf(_ZH_NOUNS), _Zipf(_ZH_VERBS), _Zipf(_ZH_STATES), _Zipf(_ZH_ADVERBS),
                   _Zipf(_ZH_PLACES)),
            "ja": (_Zipf(_JA_NOUNS), _Zipf(_JA_VERBS), _Zipf(_JA_STATES), _Zipf(_JA_ADVERBS),
                   _Zipf(_JA_PLACES)),
            "ko": (_Zipf(_KO_NOUNS), _Zipf(_KO_VERBS), _Zipf(_KO_STATES), _Zipf(_KO_ADVERBS),
                   _Zipf(_KO_PLACES)),
        }
        self.headings = {"zh": _ZH_HEADINGS, "ja": _JA_HEADINGS, "ko": _KO_HEADINGS}
        # Pools that later templates use as single slots; filled in dependency order.
        self.errors: tuple[str, ...] = ()
        self.commands: tuple[str, ...] = ()
        self.urls: tuple[str, ...] = ()
        self.comments: tuple[str, ...] = ()
        pick = self.pickers(r, "en")
        self.comments = self._render_many(r, ("{verb} the {noun} before {ving} the {noun2}",
                                              "{adj} {noun} for {snake}",
                                              "keep the {noun} {adj}",
                                              "{noun} is {adj} when {snake} is unset",
                                              "{ved} {noun} from {noun2}"), pick, 1500)
        self.errors = self._render_many(r, _ERROR_TEMPLATES, pick, 1500)
        self.commands = self._render_many(r, _COMMAND_TEMPLATES, pick, 2500)
        self.urls = self._render_many(r, _URL_TEMPLATES, pick, 2500)

        self.prose: dict[str, _Pool] = {}
        self.user: dict[str, _Pool] = {}
        self.reasoning: dict[str, _Pool] = {}
        self.prose["en"] = _Pool.of(self._render_many(r, _EN_PROSE, pick, 24_000))
        self.user["en"] = _Pool.of(self._render_many(r, _EN_USER, pick, 8_000))
        self.reasoning["en"] = _Pool.of(self._render_many(r, _EN_REASONING, pick, 6_000))
        cjk: tuple[tuple[Language, tuple[str, ...]], ...] = (
            ("zh", _ZH_PROSE), ("ja", _JA_PROSE), ("ko", _KO_PROSE))
        for lang, templates in cjk:
            lang_pick = self.pickers(r, lang)
            self.prose[lang] = _Pool.of(self._render_many(r, templates, lang_pick, 5_000))
            self.user[lang] = self.prose[lang]
            self.reasoning[lang] = self.prose[lang]

        self.code = {
            "py": _Pool.of(self._render_many(r, _PY_LINE_TEMPLATES, pick, 8_000)),
            "ts": _Pool.of(self._render_many(r, _TS_LINE_TEMPLATES, pick, 3_000)),
            "go": _Pool.of(self._render_many(r, _GO_LINE_TEMPLATES, pick, 2_000)),
            "conf": _Pool.of(self._render_many(r, _CONFIG_LINE_TEMPLATES, pick, 2_000)),
        }
        self.cjk_code = {lang: _Pool.of(self._cjk_code_lines(r, lang)) for lang in self.words}
        self.logs = _Pool.of(self._log_lines(r, pick, 6_000))
        self.tests = _Pool.of(self._render_many(r, _TEST_LINE_TEMPLATES, pick, 5_000))
        self.git = _Pool.of(self._render_many(r, _GIT_LINE_TEMPLATES, pick, 3_000))
        self.listing = _Pool.of(self._render_many(r, _LISTING_LINE_TEMPLATES, pick, 2_000))
        self.install = _Pool.of(self._render_many(r, _INSTALL_LINE_TEMPLATES, pick, 2_000))
        self.grep = _Pool.of(self._render_many(r, _GREP_LINE_TEMPLATES, pick, 4_000))
        self.traces = _Pool.of(self._render_many(r, _TRACE_TEMPLATES, pick, 3_000))
        self.snapshot = _Pool.of(self._render_many(r, _SNAPSHOT_TEMPLATES, pick, 3_000))
        self.records = _Pool.of(self._json_records(r, pick, 3_000))
        self.web_results = {lang: _Pool.of(self._web_results(r, lang, pick, 1_500))
                            for lang in ("en", "zh", "ja", "ko")}

        self.templates: dict[str, dict[str, tuple[tuple[str, ...], ...]]] = {
            "en": {"prose": _compile_all(_EN_PROSE), "user": _compile_all(_EN_USER),
                   "preface": _compile_all(_EN_PREFACE)},
            "zh": {"prose": _compile_all(_ZH_PROSE), "user": _compile_all(_ZH_PROSE),
                   "preface": _compile_all(_ZH_PREFACE)},
            "ja": {"prose": _compile_all(_JA_PROSE), "user": _compile_all(_JA_PROSE),
                   "preface": _compile_all(_JA_PREFACE)},
            "ko": {"prose": _compile_all(_KO_PROSE), "user": _compile_all(_KO_PROSE),
                   "preface": _compile_all(_KO_PREFACE)},
        }

    # -- combinatorial names ------------------------------------------------------------------

    @staticmethod
    def _snake_identifiers(r: random.Random) -> list[str]:
        names = [f"{v}_{n}" for v in _ID_VERBS for n in _ID_NOUNS]
        names += [f"{n}_{m}" for n in _ID_NOUNS[:40] for m in _ID_NOUNS[40:80]]
        names += [f"_{v}_{a}_{n}" for v in _ID_VERBS[:12] for a in ("raw", "all", "next", "last")
                  for n in _ID_NOUNS[:30]]
        r.shuffle(names)
        return names

    @staticmethod
    def _camel_identifiers(r: random.Random) -> list[str]:
        names = [f"{v}{n.capitalize()}" for v in _ID_VERBS for n in _ID_NOUNS]
        names += [f"{v}{n.capitalize()}{m.capitalize()}" for v in _ID_VERBS[:15]
                  for n in _ID_NOUNS[:20] for m in ("Id", "Map", "List", "Count", "Async")]
        r.shuffle(names)
        return names

    @staticmethod
    def _class_names(r: random.Random) -> list[str]:
        stems = [n.capitalize() for n in _ID_NOUNS]
        names = [f"{s}{x}" for s in stems for x in _CLASS_SUFFIXES]
        names += [f"{m}{s}{x}" for m in _CLASS_MODIFIERS for s in stems[:30]
                  for x in _CLASS_SUFFIXES[:12]]
        r.shuffle(names)
        return names

    @staticmethod
    def _paths(r: random.Random) -> list[str]:
        paths = []
        for d in _PATH_DIRS:
            ext = _EXTENSION_BY_DIR.get(d, ".py")
            for m in _PATH_MODULES:
                paths.append(f"{d}/{m}{ext}")
        r.shuffle(paths)
        # Files everybody touches rank first.
        head = ["gateway/run.py", "run_agent.py", "hermes_state.py", "cli.py", "model_tools.py",
                "agent/prompt_builder.py", "tools/terminal_tool.py", "hermes_cli/config.py",
                "pyproject.toml", "README.md", "toolsets.py", "gateway/session.py"]
        return head + [p for p in paths if p not in head]

    @staticmethod
    def _test_paths(r: random.Random) -> list[str]:
        paths = [f"tests/{d}/test_{m}.py" for d in ("gateway", "tools", "agent", "cron", "cli")
                 for m in _PATH_MODULES]
        paths += [f"tests/test_{m}.py" for m in _PATH_MODULES]
        r.shuffle(paths)
        return paths

    # -- pickers ------------------------------------------------------------------------------

    def pickers(
        self, r: random.Random, lang: Language, ctx: _Context | None = None
    ) -> dict[str, Picker]:
        """The slot fillers for ``lang``, drawing from ``r`` (and from ``ctx`` when given)."""
        rnd = r.random
        choice = r.choice

        def local(items: Sequence[str] | None, share: float, zipf: _Zipf) -> Picker:
            if not items:
                return lambda: zipf.pick(r)
            return lambda: items[int(rnd() * len(items))] if rnd() < share else zipf.pick(r)

        noun = local(ctx.nouns if ctx else None, 0.35, self.nouns)
        snake = local(ctx.snakes if ctx else None, 0.6, self.snakes)
        camel = local(ctx.camels if ctx else None, 0.6, self.camels)
        cls = local(ctx.classes if ctx else None, 0.6, self.classes)
        path = local(ctx.paths if ctx else None, 0.75, self.paths)
        test_path = local(ctx.test_paths if ctx else None, 0.75, self.test_paths)

        def verb(form: int) -> Picker:
            return lambda: self.verbs.pick(r)[form]

        def identifier() -> str:
            return snake() if rnd() < 0.6 else (camel() if rnd() < 0.6 else cls())

        def integer() -> str:
            return str(int(10 ** (rnd() * 4.2)))

        def version() -> str:
            return f"{int(rnd() * 4)}.{int(rnd() * 30)}.{int(rnd() * 12)}"

        def clock() -> str:
            return f"{int(rnd() * 24):02d}:{int(rnd() * 60):02d}"

        def duration() -> str:
            return f"{rnd() * 40:.2f}s" if rnd() < 0.6 else f"{int(rnd() * 900) + 5}ms"

        pick: dict[str, Picker] = {
            "n": noun,
            "noun": noun,
            "noun_cap": lambda: noun().capitalize(),
            "ns": lambda: _plural(noun()),
            "a": lambda: self.adjectives.pick(r),
            "adj": lambda: self.adjectives.pick(r),
            "adv": lambda: self.adverbs.pick(r),
            "v": verb(0),
            "verb": verb(0),
            "v_cap": lambda: verb(0)().capitalize(),
            "verb_cap": lambda: verb(0)().capitalize(),
            "vs": verb(1),
            "ved": verb(2),
            "ven": verb(3),
            "ving": verb(4),
            "ving_cap": lambda: verb(4)().capitalize(),
            "snake": snake,
            "camel": camel,
            "pascal": lambda: camel()[:1].upper() + camel()[1:],
            "cls": cls,
            "id": identifier,
            "upper": lambda: snake().strip("_").upper(),
            "kebab": lambda: snake().strip("_").replace("_", "-"),
            "word": lambda: noun(),
            "path": path,
            "dir": lambda: path().rpartition("/")[0] or ".",
            "testpath": test_path,
            "test": lambda: f"{test_path()}::test_{snake().strip('_')}",
            "module": lambda: choice(_PYTHON_MODULES) if rnd() < 0.4 else choice(_PATH_MODULES),
            "modpath": lambda: path().rpartition(".")[0].replace("/", "."),
            "root": lambda: f"/home/{choice(_USERS)}/src/{choice(_PROJECTS)}",
            "project": lambda: choice(_PROJECTS),
            "pkg": lambda: self.packages.pick(r),
            "ver": version,
            "int": integer,
            "small": lambda: str(1 + int(rnd() * 9)),
            "exit": lambda: choice(("0", "0", "1", "2", "127")),
            "line": lambda: str(1 + int(rnd() ** 2 * 1500)),
            "pct": lambda: f"{rnd() * 100:.1f}%",
            "pctw": lambda: f"{int(rnd() * 100):3d}%",
            "plusminus": lambda: "+" * int(1 + rnd() * 12) + "-" * int(rnd() * 8),
            "pad": lambda: " " * (1 + int(rnd() * 20)),
            "dur": duration,
            "time": clock,
            "clock": clock,
            "day": lambda: str(1 + int(rnd() * 28)),
            "month": lambda: choice(_MONTHS),
            "year": lambda: str(2019 + int(rnd() * 7)),
            "hex": lambda: f"{r.getrandbits(28):07x}",
            "hexbyte": lambda: f"{r.getrandbits(8):02x}",
            "port": lambda: str(choice(_PORTS)),
            "status": lambda: str(choice(_HTTP_STATUSES)),
            "method": lambda: choice(_HTTP_METHODS),
            "level": lambda: choice(("info", "debug", "warning", "error")),
            "val": lambda: choice(("None", "True", "False", "an empty list", "-1", "0", "{}")),
            "host": lambda: choice(("prod-1", "staging", "the VPS", "the Pi", "worker-2",
                                    "localhost", "the build box")),
            "place": lambda: self.places.pick(r),
            "platform": lambda: choice(_PLATFORMS),
            "service": lambda: choice(("gateway", "api", "worker", "postgres", "redis", "nginx",
                                       "scheduler", "hermes-gateway", "caddy")),
            "user": lambda: choice(_USERS),
            "branch": lambda: choice(("main", "dev", "release", "fix/" + noun())),
            "domain": lambda: choice(_DOMAINS),
            "model": lambda: choice(_MODELS)[0],
            "pytype": lambda: choice(_PY_TYPES),
            "tstype": lambda: choice(_TS_TYPES),
            "gotype": lambda: choice(_GO_TYPES),
            "container": lambda: choice(("list", "dict", "set", "Counter", "deque")),
            "errtype": lambda: choice(self.errors).partition(":")[0] if self.errors else "Error",
            "err": lambda: choice(self.errors),
            "cmd": lambda: choice(self.commands),
            "url": lambda: choice(self.urls),
            "comment": lambda: choice(self.comments),
            "comment_cap": lambda: choice(self.comments).capitalize(),
            "title": lambda: noun().capitalize() + " " + noun(),
            "sentence": lambda: choice(self.prose["en"].items),
        }
        if lang == "en":
            return pick
        nouns, verbs, states, adverbs, places = self.words[lang]
        cjk_noun = local(ctx.local_nouns if ctx else None, 0.35, nouns)
        pick.update(
            n=cjk_noun,
            v=lambda: verbs.pick(r),
            st=lambda: states.pick(r).replace("_", " "),
            adv=lambda: adverbs.pick(r),
            place=lambda: places.pick(r),
        )
        if lang == "ko":

            def particle(with_final: str, without: str) -> Picker:
                def draw() -> str:
                    w = cjk_noun()
                    return w + (with_final if _hangul_final(w) else without)

                return draw

            pick.update(n_eul=particle("을", "를"), n_eun=particle("은", "는"),
                        n_i=particle("이", "가"), n_wa=particle("과", "와"))
        return pick

    # -- pools --------------------------------------------------------------------------------

    @staticmethod
    def _render_many(
        r: random.Random, templates: Sequence[str], pick: dict[str, Picker], count: int
    ) -> tuple[str, ...]:
        compiled = _compile_all(templates)
        return tuple(_render(compiled[int(r.random() * len(compiled))], pick)
                     for _ in range(count))

    def _cjk_code_lines(self, r: random.Random, lang: str) -> list[str]:
        prose = self.prose[lang].items
        shapes = ("    # {}", "    logger.info(\"{}\")", "        raise ValueError(\"{}\")",
                  "    \"\"\"{}\"\"\"", "  // {}", "    msg = \"{}\"")
        lines = [r.choice(shapes).format(r.choice(prose)) for _ in range(600)]
        lines += r.sample(self.code["py"].items, 1200)
        return lines

    def _log_lines(self, r: random.Random, pick: dict[str, Picker], count: int) -> list[str]:
        messages = _compile_all(_LOG_MESSAGE_TEMPLATES)
        loggers = ("gateway.run", "agent.loop", "tools.terminal", "hermes_state", "cron.scheduler",
                   "gateway.platforms.telegram", "uvicorn.access", "httpx", "model_tools")
        lines = []
        for _ in range(count):
            stamp = (f"2025-{1 + int(r.random() * 12):02d}-{1 + int(r.random() * 28):02d} "
                     f"{pick['clock']()}:{int(r.random() * 60):02d},{int(r.random() * 1000):03d}")
            lines.append(f"{stamp} {r.choice(_LOG_LEVELS)} {r.choice(loggers)}: "
                         f"{_render(messages[int(r.random() * len(messages))], pick)}")
        return lines

    @staticmethod
    def _json_records(r: random.Random, pick: dict[str, Picker], count: int) -> list[str]:
        statuses = ("ok", "pending", "failed", "running", "queued", "done", "archived")
        return [
            json.dumps({
                "id": int(pick["int"]()), "name": pick["snake"](), "status": r.choice(statuses),
                "owner": pick["user"](), "updated_at": f"2025-{1 + int(r.random() * 12):02d}-"
                f"{1 + int(r.random() * 28):02d}T{pick['clock']()}:00Z",
                "tags": [pick["noun"](), pick["adj"]()], "size": int(pick["int"]()),
            })
            for _ in range(count)
        ]

    def _web_results(
        self, r: random.Random, lang: str, pick: dict[str, Picker], count: int
    ) -> list[str]:
        titles = _compile_all(_EN_TITLE_TEMPLATES)
        prose = self.prose[lang].items
        results = []
        for _ in range(count):
            if lang == "en":
                title = _render(titles[int(r.random() * len(titles))], pick)
                description = " ".join(r.choices(prose, k=2))
            else:
                title = r.choice(prose)[:24]
                description = " ".join(r.choices(prose, k=3))
            results.append(json.dumps(
                {"title": title, "url": r.choice(self.urls), "description": description},
                ensure_ascii=False,
            ))
        return results


def _compile_all(templates: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    return tuple(_compile(t) for t in templates)


@functools.cache
def _vocab() -> _Vocab:
    return _Vocab()


# ---------------------------------------------------------------------------------------------
# Sessions
# ---------------------------------------------------------------------------------------------

_SOURCES = (("cli", 40), ("telegram", 20), ("discord", 12), ("slack", 9), ("cron", 7),
            ("api", 5), ("whatsapp", 4), ("signal", 2), ("email", 1))
_MODELS = (("anthropic/claude-sonnet-4", 30), ("anthropic/claude-opus-4.1", 8),
           ("openai/gpt-5", 14), ("openai/gpt-4.1-mini", 8), ("google/gemini-2.5-pro", 10),
           ("nousresearch/hermes-4-405b", 12), ("qwen/qwen3-coder", 8),
           ("deepseek/deepseek-chat-v3.1", 6), ("moonshotai/kimi-k2", 4))
# Which tools a session leans on, by the kind of work it is.
_TOOL_WEIGHTS = {
    "coding": (("terminal", 35), ("read_file", 25), ("search_files", 12), ("patch", 8),
               ("write_file", 7), ("execute_code", 4), ("web_search", 5), ("web_extract", 2),
               ("browser_navigate", 1), ("browser_snapshot", 1)),
    "research": (("web_search", 35), ("web_extract", 25), ("browser_navigate", 12),
                 ("browser_snapshot", 10), ("terminal", 6), ("read_file", 4), ("write_file", 4),
                 ("execute_code", 4)),
    "ops": (("terminal", 60), ("read_file", 15), ("search_files", 8), ("web_search", 5),
            ("write_file", 5), ("patch", 5), ("execute_code", 2)),
}
_KINDS = (("coding", 65), ("research", 22), ("ops", 13))
# Tool rounds per user turn (0 = a plain answer).
_ROUNDS = (0, 1, 2, 3, 4)
_ROUND_WEIGHTS = (25, 35, 22, 12, 6)
_CALLS = (1, 2, 3)
_CALL_WEIGHTS = (60, 28, 12)
_TERMINAL_KINDS = ("tests", "git", "listing", "logs", "install", "grep", "curl", "traceback")


def _cum(pairs: Sequence[tuple[Any, int]]) -> tuple[tuple[Any, ...], list[float]]:
    return tuple(p[0] for p in pairs), list(itertools.accumulate(p[1] for p in pairs))


_SOURCE_CHOICES = _cum(_SOURCES)
_MODEL_CHOICES = _cum(_MODELS)
_KIND_CHOICES = _cum(_KINDS)
_TOOL_CHOICES = {kind: _cum(weights) for kind, weights in _TOOL_WEIGHTS.items()}
_ROUND_CUM = list(itertools.accumulate(_ROUND_WEIGHTS))
_CALL_CUM = list(itertools.accumulate(_CALL_WEIGHTS))


@dataclass(frozen=True, slots=True)
class _Context:
    """What one session keeps coming back to: its files, names and topic."""

    paths: tuple[str, ...]
    test_paths: tuple[str, ...]
    snakes: tuple[str, ...]
    camels: tuple[str, ...]
    classes: tuple[str, ...]
    nouns: tuple[str, ...]
    local_nouns: tuple[str, ...]

    @classmethod
    def draw(cls, r: random.Random, vocab: _Vocab, lang: Language) -> _Context:
        nouns = tuple(vocab.nouns.pick(r) for _ in range(8))
        local = nouns if lang == "en" else tuple(vocab.words[lang][0].pick(r) for _ in range(8))
        return cls(
            paths=tuple(vocab.paths.pick(r) for _ in range(10)),
            test_paths=tuple(vocab.test_paths.pick(r) for _ in range(4)),
            snakes=tuple(vocab.snakes.pick(r) for _ in range(12)),
            camels=tuple(vocab.camels.pick(r) for _ in range(8)),
            classes=tuple(vocab.classes.pick(r) for _ in range(6)),
            nouns=nouns,
            local_nouns=local,
        )


class _SessionWriter:
    """Writes the messages of one session, turn by turn, from the session's own ``Random``."""

    def __init__(self, r: random.Random, vocab: _Vocab, lang: Language, started_at: float,
                 length: int) -> None:
        self.r = r
        self.vocab = vocab
        self.lang = lang
        self.length = length
        self.t = started_at
        self.messages: list[CorpusMessage] = []
        self.kind = r.choices(_KIND_CHOICES[0], cum_weights=_KIND_CHOICES[1])[0]
        self.ctx = _Context.draw(r, vocab, lang)
        self.pick = vocab.pickers(r, lang, self.ctx)
        self.en_pick = self.pick if lang == "en" else vocab.pickers(r, "en", self.ctx)
        self.templates = vocab.templates[lang]
        self.prose = vocab.prose[lang]
        self.reasoning_share = 0.2 + 0.4 * r.random()
        self.code_kind = r.choices(("py", "ts", "go", "conf"), cum_weights=(70, 85, 93, 100))[0]

    def write(self) -> tuple[CorpusMessage, ...]:
        r = self.r
        while len(self.messages) < self.length:
            self._user()
            rounds = r.choices(_ROUNDS, cum_weights=_ROUND_CUM)[0]
            for _ in range(rounds):
                if len(self.messages) >= self.length:
                    break
                self._tool_round()
            if len(self.messages) < self.length:
                self._final()
        return _close_tool_pairs(self.messages[: self.length], self.pick)

    # -- messages -----------------------------------------------------------------------------

    def _fresh(self, kind: str) -> str:
        templates = self.templates[kind]
        return _render(templates[int(self.r.random() * len(templates))], self.pick)

    def _advance(self, low: float, high: float) -> float:
        # Log-uniform gaps: mostly short, sometimes long.
        self.t += low * (high / low) ** self.r.random()
        return round(self.t, 3)

    def _user(self) -> None:
        r = self.r
        pool = self.vocab.user[self.lang]
        parts = [self._fresh("user")]
        extra = int(r.random() * 4)
        if extra:
            parts.extend(r.choices(pool.items, k=extra))
        text = " ".join(parts) if self.lang != "ja" and self.lang != "zh" else "".join(parts)
        if r.random() < 0.12:
            paste = self.vocab.traces if r.random() < 0.5 else self.vocab.logs
            text += "\n\n```\n" + paste.lines(r, int(300 + r.random() * 1500)) + "\n```"
        gap = (2.0, 30.0) if not self.messages else (20.0, 1800.0)
        self.messages.append(CorpusMessage(
            role="user", content=text, tool_calls=None, tool_call_id=None, tool_name=None,
            timestamp=self._advance(*gap), finish_reason=None, reasoning=None,
            token_count=None,
        ))

    def _reasoning(self) -> str | None:
        r = self.r
        if r.random() >= self.reasoning_share:
            return None
        lang = self.lang if self.lang != "en" and r.random() < 0.4 else "en"
        return " ".join(r.choices(self.vocab.reasoning[lang].items, k=1 + int(r.random() * 6)))

    def _tool_round(self) -> None:
        r = self.r
        names, cum = _TOOL_CHOICES[self.kind]
        count = r.choices(_CALLS, cum_weights=_CALL_CUM)[0]
        calls = []
        results = []
        for _ in range(count):
            name = r.choices(names, cum_weights=cum)[0]
            call_id = f"call_{r.getrandbits(96):024x}"
            arguments, output = self._tool(name)
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": arguments}})
            results.append((call_id, name, output))
        preface = self._fresh("preface") if r.random() < 0.45 else None
        reasoning = self._reasoning()
        tokens = 20 * count + (len(preface) // 4 if preface else 0)
        tokens += len(reasoning) // 4 if reasoning else 0
        self.messages.append(CorpusMessage(
            role="assistant", content=preface, tool_calls=calls, tool_call_id=None,
            tool_name=None, timestamp=self._advance(1.5, 45.0), finish_reason="tool_calls",
            reasoning=reasoning, token_count=tokens,
        ))
        for call_id, name, output in results:
            self.messages.append(CorpusMessage(
                role="tool", content=output, tool_calls=None, tool_call_id=call_id,
                tool_name=name, timestamp=self._advance(0.2, 40.0), finish_reason=None,
                reasoning=None, token_count=None,
            ))

    def _final(self) -> None:
        r = self.r
        prose = self.prose.items
        sep = " " if self.lang in ("en", "ko") else ""
        parts = [sep.join([self._fresh("prose"), *r.choices(prose, k=1 + int(r.random() * 3))])]
        style = r.random()
        if style < 0.5:
            parts.append(f"## {self._heading()}\n\n"
                         + "\n".join("- " + s for s in r.choices(prose, k=2 + int(r.random() * 5))))
        if r.random() < 0.4:
            pool = self.vocab.code[self.code_kind]
            if self.lang != "en" and r.random() < 0.5:
                pool = self.vocab.cjk_code[self.lang]
            lang_tag = {"py": "python", "ts": "typescript", "go": "go", "conf": "yaml"}
            parts.append(f"```{lang_tag[self.code_kind]}\n"
                         + pool.lines(r, int(150 + r.random() * 1200)) + "\n```")
        if r.random() < 0.12:
            rows = [f"| `{self.pick['path']()}` | {r.choice(prose)} |"
                    for _ in range(2 + int(r.random() * 4))]
            parts.append("| file | change |\n| --- | --- |\n" + "\n".join(rows))
        if r.random() < 0.6:
            parts.append(sep.join(r.choices(prose, k=1 + int(r.random() * 3))))
        content = "\n\n".join(parts)
        reasoning = self._reasoning()
        tokens = len(content) // (4 if self.lang == "en" else 2)
        tokens += len(reasoning) // 4 if reasoning else 0
        self.messages.append(CorpusMessage(
            role="assistant", content=content, tool_calls=None, tool_call_id=None,
            tool_name=None, timestamp=self._advance(2.0, 90.0),
            finish_reason="stop" if r.random() < 0.98 else "length",
            reasoning=reasoning, token_count=tokens,
        ))

    def _heading(self) -> str:
        if self.lang == "en":
            return self.r.choice(("Summary", "What changed", "Root cause", "Next steps",
                                  "Findings", "Test results", "Plan", "Notes"))
        return self.r.choice(self.vocab.headings[self.lang])

    # -- tools --------------------------------------------------------------------------------

    def _size(self) -> int:
        return int(_TOOL_RESULT_MIN * (_TOOL_RESULT_MAX / _TOOL_RESULT_MIN) ** self.r.random())

    def _tool(self, name: str) -> tuple[str, str]:
        """(arguments JSON, result text) of one call."""
        make: Callable[[], tuple[str, str]] = getattr(self, "_tool_" + name)
        return make()

    def _tool_terminal(self) -> tuple[str, str]:
        r, v, pick = self.r, self.vocab, self.en_pick
        kind = r.choice(_TERMINAL_KINDS)
        size = self._size()
        exit_code = 0
        if kind == "tests":
            command = f"python -m pytest {pick['testpath']()} -q"
            failed = int(r.random() * 4) if r.random() < 0.4 else 0
            passed = int(5 + r.random() * 300)
            body = v.tests.lines(r, size - 200)
            if failed:
                exit_code = 1
                body += "\n" + v.traces.lines(r, 150) + "\nE   " + pick["err"]()
            body += (f"\n{'=' * 20} {f'{failed} failed, ' if failed else ''}{passed} passed "
                     f"in {pick['dur']()} {'=' * 20}")
        elif kind == "git":
            command = r.choice(("git log --oneline -n 40", f"git diff {pick['path']()}",
                                "git status", "git show --stat HEAD"))
            body = v.git.lines(r, size)
        elif kind == "listing":
            command = f"ls -la {pick['dir']()}"
            body = f"total {pick['int']()}\n" + v.listing.lines(r, size)
        elif kind == "logs":
            command = r.choice((f"tail -n 200 logs/{pick['service']()}.log",
                                f"journalctl -u {pick['service']()} --since today",
                                f"docker compose logs --tail 100 {pick['service']()}"))
            body = v.logs.lines(r, size)
        elif kind == "install":
            command = f"pip install -U {pick['pkg']()} {pick['pkg']()}"
            body = v.install.lines(r, size)
        elif kind == "grep":
            command = f"rg -n '{pick['snake']()}' {pick['dir']()}"
            body = v.grep.lines(r, size)
        elif kind == "curl":
            command = f"curl -s http://localhost:{pick['port']()}/api/{pick['snake']()} | jq ."
            body = "[" + v.records.lines(r, size).replace("\n", ",\n") + "]"
        else:
            command = f"python {pick['path']()}"
            exit_code = 1
            body = (v.logs.lines(r, size // 2) + "\nTraceback (most recent call last):\n"
                    + v.traces.lines(r, size // 2) + "\n" + pick["err"]())
        arguments: dict[str, Any] = {"command": command}
        if r.random() < 0.3:
            arguments["timeout"] = r.choice((60, 120, 300, 600))
        result = {"output": body, "exit_code": exit_code, "error": None}
        return _json(arguments), _json(result)

    def _file_body(self, path: str, size: int) -> str:
        r, v = self.r, self.vocab
        ext = path.rpartition(".")[2]
        if ext == "md":
            pool = self.prose
        elif ext in ("yaml", "yml", "toml"):
            pool = v.code["conf"]
        elif ext in ("ts", "tsx"):
            pool = v.code["ts"]
        elif ext == "go":
            pool = v.code["go"]
        elif self.lang != "en" and r.random() < 0.3:
            pool = v.cjk_code[self.lang]
        else:
            pool = v.code["py"]
        return pool.lines(r, size)

    def _tool_read_file(self) -> tuple[str, str]:
        r = self.r
        path = self.pick["path"]()
        offset = 1 if r.random() < 0.7 else int(1 + r.random() * 800)
        text = self._file_body(path, int(self._size() * 0.88))  # numbering adds ~12%
        lines = text.split("\n")
        numbered = "\n".join(f"{i:>6}|{line}" for i, line in enumerate(lines, offset))
        total = offset + len(lines) + int(r.random() * 400)
        result = {"content": numbered, "total_lines": total, "file_size": total * 38,
                  "truncated": total > offset + len(lines)}
        return _json({"path": path, "offset": offset, "limit": 500}), _json(result)

    def _tool_write_file(self) -> tuple[str, str]:
        r = self.r
        path = self.pick["path"]()
        content = self._file_body(path, int(300 + r.random() * 2500))
        size = len(content.encode())
        return (_json({"path": path, "content": content}),
                _json({"bytes_written": size, "dirs_created": r.random() < 0.1}))

    def _tool_patch(self) -> tuple[str, str]:
        r, v = self.r, self.vocab
        path = self.pick["path"]()
        old = self._file_body(path, int(80 + r.random() * 400))
        new = self._file_body(path, int(80 + r.random() * 500))
        context = v.code["py"].lines(r, self._size() - 200).split("\n")
        start = int(1 + r.random() * 600)
        hunk = [f"@@ -{start},{len(context)} +{start},{len(context) + 2} @@"]
        hunk += [("+" if i % 7 == 3 else "-" if i % 11 == 5 else " ") + line
                 for i, line in enumerate(context)]
        diff = f"--- a/{path}\n+++ b/{path}\n" + "\n".join(hunk)
        arguments = {"mode": "replace", "path": path, "old_string": old, "new_string": new}
        return _json(arguments), _json({"success": True, "diff": diff, "files_modified": [path]})

    def _tool_search_files(self) -> tuple[str, str]:
        r, v = self.r, self.vocab
        pattern = self.pick["snake"]() if r.random() < 0.6 else self.pick["camel"]()
        # The JSON around each match adds about half again to the grep line.
        found = v.grep.lines(r, int(self._size() * 0.68)).split("\n")
        matches = []
        for line in found:
            file, _, rest = line.partition(":")
            number, _, text = rest.partition(":")
            matches.append({"path": file, "line": int(number), "content": text})
        arguments = {"pattern": pattern, "target": "content", "path": ".",
                     "file_glob": r.choice(("*.py", "*.py", "*.ts", "*.md", "*"))}
        return _json(arguments), _json({"total_count": len(matches), "matches": matches})

    def _tool_execute_code(self) -> tuple[str, str]:
        r, v = self.r, self.vocab
        code = v.code["py"].lines(r, int(200 + r.random() * 1200))
        output = (v.records if r.random() < 0.5 else v.logs).lines(r, self._size() - 120)
        result = {"status": "success", "output": output,
                  "tool_calls_made": int(r.random() * 6),
                  "duration_seconds": round(r.random() * 30, 2)}
        return _json({"code": code}), _json(result)

    def _web_lang(self) -> str:
        return self.lang if self.lang != "en" and self.r.random() < 0.7 else "en"

    def _tool_web_search(self) -> tuple[str, str]:
        r = self.r
        lang = self._web_lang()
        if lang == "en":
            query = f"{self.pick['pkg']()} {self.en_pick['n']()} {self.en_pick['a']()}"
        else:
            query = f"{self.pick['n']()} {self.pick['n']()} {self.pick['v']()}"
        results = self.vocab.web_results[lang].lines(r, self._size() - 60).replace("\n", ",")
        return _json({"query": query}), '{"success":true,"data":{"web":[' + results + "]}}"

    def _page(self, size: int) -> str:
        r = self.r
        lang = self._web_lang()
        prose = self.vocab.prose[lang]
        heading = self._heading() if lang == self.lang else self.en_pick["title"]()
        return f"# {heading}\n\n" + prose.lines(r, size).replace("\n", "\n\n", 3)

    def _tool_web_extract(self) -> tuple[str, str]:
        url = self.pick["url"]()
        page = self._page(self._size() - 150)
        result = {"results": [{"url": url, "title": page[2:40].partition("\n")[0],
                               "content": page}]}
        return _json({"urls": [url]}), _json(result)

    def _tool_browser_navigate(self) -> tuple[str, str]:
        r, v = self.r, self.vocab
        url = self.pick["url"]()
        snapshot = v.snapshot.lines(r, self._size() - 150)
        result = {"success": True, "url": url, "title": self.en_pick["title"](),
                  "snapshot": snapshot}
        return _json({"url": url}), _json(result)

    def _tool_browser_snapshot(self) -> tuple[str, str]:
        r, v = self.r, self.vocab
        snapshot = v.snapshot.lines(r, self._size() - 60)
        return _json({"full": r.random() < 0.3}), _json({"success": True, "snapshot": snapshot})


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _close_tool_pairs(
    messages: list[CorpusMessage], pick: dict[str, Picker]
) -> tuple[CorpusMessage, ...]:
    """Drop the calls of the last assistant turn whose results were cut off with the session.

    A cut can only lose results, never calls, so only the last turn with tool calls can be
    short of results; its unanswered calls are removed (and a turn left without any becomes
    plain prose), so every call in the corpus has its result and every result its call.
    """
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if message.role != "assistant" or not message.tool_calls:
            continue
        answered = {m.tool_call_id for m in messages[i + 1 :]}
        kept = [c for c in message.tool_calls if c["id"] in answered]
        if len(kept) < len(message.tool_calls):
            if kept:
                messages[i] = replace(message, tool_calls=kept)
            else:
                content = message.content or _render(_compile("I'll {v} the {n} next."), pick)
                messages[i] = replace(message, content=content, tool_calls=None,
                                      finish_reason="length")
        break
    return tuple(messages)


def _language_schedule(seed: int, block: int) -> dict[int, Language]:
    """CJK sessions of one block of ``_LANGUAGE_BLOCK`` sessions, by position in the block."""
    r = random.Random(f"hermes-bench:{seed}:languages:{block}")
    positions = r.sample(range(_LANGUAGE_BLOCK), _CJK_PER_BLOCK)
    languages: list[Language]
    if block == 0:
        languages = ["zh", "ja", "ko"]
        r.shuffle(languages)
    else:
        languages = r.choices(["zh", "ja", "ko"], weights=(5, 3, 2), k=_CJK_PER_BLOCK)
    return dict(zip(positions, languages))


def _fit_length(natural: int, remaining: int) -> int:
    """The length session gets so that the corpus ends exactly, with no session under MIN."""
    if remaining <= natural:
        return remaining
    if remaining - natural >= MIN_SESSION_MESSAGES:
        return natural
    if remaining <= MAX_SESSION_MESSAGES:
        return remaining
    return remaining - MIN_SESSION_MESSAGES


class _Planned:
    """The parts of session ``index`` that do not depend on the size of the corpus."""

    __slots__ = ("id_suffix", "jitter", "model", "natural", "r", "source")

    def __init__(self, seed: int, index: int) -> None:
        r = self.r = random.Random(f"hermes-bench:{seed}:{index}")
        span = MAX_SESSION_MESSAGES - MIN_SESSION_MESSAGES + 1
        self.natural = MIN_SESSION_MESSAGES + int(span * r.random() ** _LENGTH_SKEW)
        self.jitter = r.random()
        self.source = r.choices(_SOURCE_CHOICES[0], cum_weights=_SOURCE_CHOICES[1])[0]
        self.model = r.choices(_MODEL_CHOICES[0], cum_weights=_MODEL_CHOICES[1])[0]
        self.id_suffix = f"{r.getrandbits(24):06x}"


def _sessions(seed: int, total_messages: int | None) -> Iterator[tuple[int, _Planned, int]]:
    """(index, plan, length) of each session; ``None`` total: natural lengths, endlessly."""
    remaining = total_messages
    for index in itertools.count():
        if remaining is not None and remaining <= 0:
            return
        plan = _Planned(seed, index)
        length = plan.natural if remaining is None else _fit_length(plan.natural, remaining)
        yield index, plan, length
        if remaining is not None:
            remaining -= length


def _build(
    seed: int, index: int, plan: _Planned, length: int, started_at: float,
    schedule: dict[int, Language],
) -> CorpusSession:
    lang = schedule.get(index % _LANGUAGE_BLOCK, "en")
    writer = _SessionWriter(plan.r, _vocab(), lang, started_at, length)
    stamp = time.strftime("%Y%m%d_%H%M%S", time.gmtime(started_at))
    return CorpusSession(
        session_id=f"{stamp}_{plan.id_suffix}", source=plan.source, model=plan.model,
        started_at=round(started_at, 3), language=lang, messages=writer.write(),
    )


def generate_corpus(total_messages: int, *, seed: int = 1) -> Iterator[CorpusSession]:
    """Sessions holding exactly ``total_messages`` messages in all, generated lazily.

    Every session has MIN_SESSION_MESSAGES..MAX_SESSION_MESSAGES messages unless the whole
    corpus is smaller than MIN_SESSION_MESSAGES. Sessions start in order over about six
    months from 2025-01-01 UTC, whatever the size of the corpus.
    """
    if total_messages < 0:
        raise ValueError(f"total_messages must be >= 0, not {total_messages}")
    slot = _SPAN_SECONDS / max(1.0, total_messages / _MEAN_SESSION_MESSAGES)
    schedule: dict[int, Language] = {}
    for index, plan, length in _sessions(seed, total_messages):
        if index % _LANGUAGE_BLOCK == 0:
            schedule = _language_schedule(seed, index // _LANGUAGE_BLOCK)
        started_at = _EPOCH + slot * (index + 0.8 * plan.jitter)
        yield _build(seed, index, plan, length, started_at, schedule)


def content_bytes(sessions: Iterable[CorpusSession]) -> int:
    """UTF-8 bytes of message content plus tool-call JSON, as the store would encode it."""
    total = 0
    for session in sessions:
        for message in session.messages:
            if message.content:
                text = message.content
                total += len(text) if text.isascii() else len(text.encode())
            if message.tool_calls:
                encoded = json.dumps(message.tool_calls, ensure_ascii=False,
                                     separators=(",", ":"))
                total += len(encoded.encode())
    return total


# ---------------------------------------------------------------------------------------------
# Benchmark queries
# ---------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"[^\W_]+")
_WORD_RE = re.compile(r"[a-z]{3,}")
_CODE_RE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)
_CLAUSE_RE = re.compile(r"[.,;:!?()\[\]`\"'|*#>\n]+")
_CJK_RUN_RE = re.compile(r"[\u3041-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7a3]+")
_QUERIES_PER_SET = 24
_CJK_WORDS = {"zh": _ZH_NOUNS + _ZH_VERBS, "ja": _JA_NOUNS + _JA_VERBS,
              "ko": _KO_NOUNS + _KO_VERBS}


def _guaranteed_sessions(seed: int) -> Iterator[CorpusSession]:
    """The sessions that are the same in every corpus of QUERY_GUARANTEE_MESSAGES or more.

    Session ``i`` keeps its natural length, and so its text, whenever the messages after it
    number at least MIN_SESSION_MESSAGES; with a corpus of N >= QUERY_GUARANTEE_MESSAGES that
    holds for every session ending at or before QUERY_GUARANTEE_MESSAGES - MIN.
    """
    limit = QUERY_GUARANTEE_MESSAGES - MIN_SESSION_MESSAGES
    used = 0
    schedule: dict[int, Language] = {}
    for index, plan, length in _sessions(seed, None):
        used += length
        if used > limit:
            return
        if index % _LANGUAGE_BLOCK == 0:
            schedule = _language_schedule(seed, index // _LANGUAGE_BLOCK)
        yield _build(seed, index, plan, length, _EPOCH, schedule)


@functools.cache
def _prose_words() -> frozenset[str]:
    """Tokens of English prose proper (not identifiers or paths): phrases are made of these."""
    words = set(_EN_STOPWORDS) | set(_EN_ADJECTIVES) | set(_EN_ADVERBS)
    for noun in _EN_NOUNS:
        words.update((noun, _plural(noun)))
    for verb in _EN_VERBS:
        words.update(_verb_forms(verb))
    for template in _EN_PROSE + _EN_USER:
        words.update(_TOKEN_RE.findall(_SLOT_RE.sub(" ", template).lower()))
    return frozenset(words)


def _spread(r: random.Random, ranked: Sequence[str], k: int) -> list[str]:
    """``k`` distinct items at geometrically spaced ranks: a few common, most rarer."""
    chosen: list[str] = []
    n = len(ranked)
    for i in range(min(k, n)):
        j = min(n - 1, int(n ** ((i + r.random()) / k)) - 1)
        while ranked[j] in chosen:
            j = (j + 1) % n
        chosen.append(ranked[j])
    return chosen


def _ranked(counts: Counter[str]) -> list[str]:
    return sorted(counts, key=lambda w: (-counts[w], w))


@functools.lru_cache(maxsize=8)
def _query_sets(seed: int) -> tuple[tuple[str, tuple[str, ...]], ...]:
    r = random.Random(f"hermes-bench:{seed}:queries")
    english: list[list[str]] = []  # token lists of English prose messages
    clauses: list[list[str]] = []
    cjk_texts: dict[str, list[str]] = defaultdict(list)
    for session in _guaranteed_sessions(seed):
        for message in session.messages:
            if message.role == "tool" or not message.content:
                continue
            if session.language == "en":
                english.append(_TOKEN_RE.findall(message.content.lower()))
                prose = _CODE_RE.sub(".", message.content.lower())
                for clause in _CLAUSE_RE.split(prose):
                    tokens = _TOKEN_RE.findall(clause)
                    if len(tokens) >= 2:
                        clauses.append(tokens)
            else:
                cjk_texts[session.language].append(message.content)

    def eligible(token: str) -> bool:
        return token not in _EN_STOPWORDS and _WORD_RE.fullmatch(token) is not None

    df: Counter[str] = Counter()
    holders: dict[str, list[int]] = defaultdict(list)
    for i, tokens in enumerate(english):
        for token in set(tokens):
            if eligible(token):
                df[token] += 1
                holders[token].append(i)
    ranked = _ranked(df)
    one_term = _spread(r, ranked, _QUERIES_PER_SET)

    two_term: list[str] = []
    for first in _spread(r, ranked, _QUERIES_PER_SET * 2):
        tokens = sorted({t for t in english[r.choice(holders[first])] if eligible(t)} - {first})
        query = f"{first} {r.choice(tokens)}" if tokens else ""
        if tokens and query not in two_term:
            two_term.append(query)
        if len(two_term) == _QUERIES_PER_SET:
            break

    prose_words = _prose_words()
    phrases: list[str] = []
    for _ in range(100_000):
        if len(phrases) == _QUERIES_PER_SET:
            break
        tokens = r.choice(clauses)
        width = 2 if r.random() < 0.5 or len(tokens) < 3 else 3
        start = int(r.random() * (len(tokens) - width + 1))
        window = tokens[start : start + width]
        if eligible(window[0]) and eligible(window[-1]) and prose_words.issuperset(window):
            phrase = " ".join(window)
            if phrase not in phrases:
                phrases.append(phrase)

    per_language = _QUERIES_PER_SET // 3
    one_char: list[str] = []
    two_char: list[str] = []
    four_char: list[str] = []
    for lang in ("zh", "ja", "ko"):
        texts = cjk_texts[lang]
        runs = [run for text in texts for run in _CJK_RUN_RE.findall(text)]
        chars: Counter[str] = Counter()
        for text in texts:
            chars.update(set("".join(_CJK_RUN_RE.findall(text))))
        one_char += _spread(r, _ranked(chars), per_language)
        for width, out in ((2, two_char), (4, four_char)):
            words: Counter[str] = Counter()
            for word in _CJK_WORDS[lang]:
                if len(word) == width:
                    hits = sum(1 for text in texts if word in text)
                    if hits:
                        words[word] = hits
            picked = _spread(r, _ranked(words), per_language)
            windows = sorted({run[i : i + width] for run in runs
                              for i in range(len(run) - width + 1)})
            r.shuffle(windows)
            for piece in windows:
                if len(picked) == per_language:
                    break
                if piece not in picked:
                    picked.append(piece)
            out += picked
    return (
        ("en_1term", tuple(one_term)),
        ("en_2term", tuple(two_term)),
        ("en_phrase", tuple(phrases)),
        ("cjk_1char", tuple(one_char)),
        ("cjk_2char", tuple(two_char)),
        ("cjk_4char", tuple(four_char)),
    )


def query_terms(seed: int = 1) -> dict[str, list[str]]:
    """Benchmark queries drawn from the corpus vocabulary, 24 per set.

    ``en_1term``: single words, from very common to rare. ``en_2term``: two space-separated
    words that occur in the same message (AND). ``en_phrase``: two or three words that occur
    consecutively (quote them for FTS5). ``cjk_1char`` / ``cjk_2char`` / ``cjk_4char``: one,
    two and four CJK characters, a third each from Chinese, Japanese and Korean text.

    Guarantee: every query matches (as described in the module docstring) the content of at
    least one user or assistant message of ``generate_corpus(n, seed=seed)`` for every
    ``n >= QUERY_GUARANTEE_MESSAGES``.
    """
    return {name: list(queries) for name, queries in _query_sets(seed)}
