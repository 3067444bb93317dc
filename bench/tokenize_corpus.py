"""The tokenize bench's corpus: four labelled categories of text, built offline and the same
bytes on every machine that has the same files (and Python).

    corpus = build_corpus(64, {"prose": .25, "multilingual": .25, "code": .25, "adversarial": .25})
    corpus.docs_of("prose")       # list[str]; "all" is every document, categories interleaved
    corpus.composition            # per category: MB, documents, files, where each came from

  prose         English and other prose the machine has: licence texts, /usr/share/doc
                (copyright, changelog, README, NEWS, .txt/.md/.rst, gzipped or not), GNU info
                manuals, Python's own documentation (pydoc_data's topics, LICENSE.txt),
                installed packages' descriptions (METADATA), READMEs and licences, and books
                when present (nltk_data's gutenberg, fortunes). Files whose text looks like
                code (over 4% of its characters among {}();=<>[]_) are left out. When the
                machine has less than the category's share, the distinct text is repeated
                to fill it and a note says so; the category is never filled from code.
  multilingual  sentences generated from the word lists below (real words of 23 languages in
                14 scripts, sampled by a Zipf weight of their rank, with the punctuation and
                spacing each script uses: none between words in Chinese, Japanese and Thai,
                Korean nouns with their particles), after the real files the machine has: the
                stdlib's CJK test files (test/cjkencodings/*utf-8*) and shared/seeds (Turkish).
  code          Python source of the stdlib and of installed packages, C headers under
                /usr/include.
  adversarial   random code points from all planes, emoji sequences (ZWJ, skin tones, flags),
                mixed whitespace runs, digit runs, "=" runs, random letters, and single pieces
                of 64-256 KB (one letter repeated, CJK without spaces, spaces, digits, "=",
                random letters; 5% of the share, scaled down with it), from a fixed seed.

A category's documents come from its sources in turn, each time from the source that has given
the fewest bytes so far; a source's files in the order of a hash of their path relative to
its root (not alphabetically: a 16 MB share then samples every package, not the first few),
skipping any whose text was taken already; a file over 256 KB is cut at line ends into
documents of at most 256 KB, and the last document of a category is cut so the category is
its share's size.
"""

from __future__ import annotations

import gzip
import hashlib
import random
import site
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

CATEGORIES = ("prose", "multilingual", "code", "adversarial")
MAX_DOC = 256 << 10        # larger files are cut into documents of at most this many bytes
CODE_CHARS = set("{}();=<>[]_")
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Category:
    name: str
    docs: list[str] = field(default_factory=list)
    sources: dict[str, dict] = field(default_factory=dict)   # source -> files, bytes
    notes: list[str] = field(default_factory=list)
    nbytes: int = 0

    def add(self, source: str, text: str, files: int = 1) -> None:
        entry = self.sources.setdefault(source, {"files": 0, "bytes": 0})
        size = len(text.encode("utf-8"))
        entry["files"] += files
        entry["bytes"] += size
        self.nbytes += size
        self.docs.append(text)


@dataclass
class Corpus:
    categories: dict[str, Category]
    order: list[tuple[str, int]]     # "all": (category, index) in a seeded shuffle
    seed: int

    def docs_of(self, name: str) -> list[str]:
        if name == "all":
            return [self.categories[c].docs[i] for c, i in self.order]
        return self.categories[name].docs

    def names(self) -> list[str]:
        """Categories with documents, then "all"."""
        return [c for c in self.categories if self.categories[c].docs] + ["all"]

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.categories.values())

    def digest(self) -> str:
        """sha256 of every document in "all" order: equal digests, equal corpora."""
        h = hashlib.sha256()
        for doc in self.docs_of("all"):
            h.update(doc.encode("utf-8"))
            h.update(b"\0")
        return h.hexdigest()

    @property
    def composition(self) -> dict:
        return {"bytes": self.nbytes, "documents": len(self.order), "seed": self.seed,
                "sha256": self.digest(),
                "categories": {c.name: {"bytes": c.nbytes, "documents": len(c.docs),
                                        "files": sum(s["files"] for s in c.sources.values()),
                                        "sources": c.sources, "notes": c.notes}
                               for c in self.categories.values()}}


# ---- files the machine has ------------------------------------------------------------------

def _stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _site_packages() -> list[Path]:
    paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                           *site.getsitepackages()])
    return [Path(p) for p in paths if Path(p).is_dir()]


def _hash_order(root: Path, paths) -> list[Path]:
    """Paths in the order of a hash of their path under root: the same on every machine."""
    return sorted(paths, key=lambda p: hashlib.sha1(
        str(p.relative_to(root)).encode("utf-8", "surrogateescape")).digest())


def _walk(root: Path, keep, skip_dirs=()) -> list[Path]:
    if not root.is_dir():
        return []
    out = []
    for path in root.rglob("*"):
        if any(part in skip_dirs for part in path.relative_to(root).parts[:-1]):
            continue
        if keep(path) and path.is_file() and not path.is_symlink():
            out.append(path)
    return _hash_order(root, out)


def _read(path: Path) -> str | None:
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None
    return text if text.strip() else None


def _looks_like_code(text: str) -> bool:
    sample = text[:200_000]
    return sum(1 for ch in sample if ch in CODE_CHARS) > 0.04 * len(sample)


def _metadata_description(path: Path) -> str | None:
    """A package's METADATA without its header lines: the description (README) it carries."""
    text = _read(path)
    if text is None or "\n\n" not in text:
        return None
    return text.split("\n\n", 1)[1]


PROSE_NAMES = ("copyright", "changelog", "readme", "news", "authors", "thanks", "todo", "history",
               "license", "licence", "notice", "faq", "bugs", "contributing", "changes")
PROSE_SUFFIXES = (".txt", ".md", ".rst", "")


def _is_prose_doc(path: Path) -> bool:
    name = path.name.lower()
    stem = name[:-3] if name.endswith(".gz") else name
    base, last = stem.split(".")[0], Path(stem).suffix
    if last in (".html", ".htm", ".css", ".js", ".png", ".gif", ".svg", ".pdf", ".json",
                ".xml", ".c", ".h", ".py", ".pl", ".sh", ".awk", ".cocci", ".el", ".conf"):
        return False
    return any(base.startswith(n) for n in PROSE_NAMES) or last in (".txt", ".md", ".rst")


def prose_sources() -> list[tuple[str, list]]:
    """(source, [Path or (label, text)]) in the order they are drawn from (round-robin)."""
    doc = Path("/usr/share/doc")
    sources = [
        ("/usr/share/common-licenses", _walk(Path("/usr/share/common-licenses"),
                                             lambda p: True)),
        ("/usr/share/doc (copyright, changelogs, READMEs, NEWS, text)",
         _walk(doc, _is_prose_doc)),
        ("/usr/share/info (GNU manuals)",
         _walk(Path("/usr/share/info"), lambda p: ".info" in p.name)),
    ]
    python_docs = []
    try:
        from pydoc_data.topics import topics   # the reference manual's text, in the stdlib
        python_docs += [(f"pydoc_data.topics[{k}]", topics[k]) for k in sorted(topics)]
    except ImportError:
        pass
    python_docs += [p for p in [_stdlib() / "LICENSE.txt"] if p.is_file()]
    for share in dict.fromkeys([Path(sys.base_prefix) / "share" / "doc",
                                Path(sys.prefix) / "share" / "doc"]):
        python_docs += _walk(share, _is_prose_doc)
    sources.append(("Python's documentation (pydoc_data topics, LICENSE.txt, share/doc)",
                    python_docs))
    packages = []
    for root in _site_packages():
        packages += _walk(root, lambda p: p.name == "METADATA" or (
            _is_prose_doc(p) and p.suffix in (".md", ".rst", ".txt", "")
            and p.name.split(".")[0].lower() in PROSE_NAMES))
    sources.append(("installed packages' descriptions, READMEs, licences", packages))
    books = []
    for root in [Path.home() / "nltk_data" / "corpora" / "gutenberg",
                 Path("/usr/share/nltk_data/corpora/gutenberg"),
                 Path("/usr/share/games/fortunes")]:
        books += _walk(root, lambda p: p.suffix in (".txt", ""))
    sources.append(("books (nltk gutenberg, fortunes)", books))
    return sources


def code_sources() -> list[tuple[str, list]]:
    stdlib = _stdlib()
    sources = [("Python stdlib .py", _walk(stdlib, lambda p: p.suffix == ".py",
                                           skip_dirs=("site-packages", "dist-packages")))]
    packages = []
    for root in _site_packages():
        packages += _walk(root, lambda p: p.suffix == ".py")
    sources.append(("installed packages' .py", packages))
    sources.append(("/usr/include .h", _walk(Path("/usr/include"), lambda p: p.suffix == ".h")))
    return sources


def _pieces(text: str, limit: int = MAX_DOC) -> list[str]:
    """text cut at line ends into pieces of at most `limit` UTF-8 bytes (a line longer than
    that is cut where it must be)."""
    if len(text) <= limit // 4 or len(text.encode("utf-8")) <= limit:
        return [text]
    out, data = [], text.encode("utf-8")
    start = 0
    while start < len(data):
        end = min(len(data), start + limit)
        if end < len(data):
            cut = data.rfind(b"\n", start, end)
            end = cut + 1 if cut > start else end
            while end < len(data) and data[end] & 0xC0 == 0x80:   # not inside a character
                end -= 1
        out.append(data[start:end].decode("utf-8"))
        start = end
    return out


def _cut(text: str, nbytes: int) -> str:
    """At most nbytes of text, at a line end when there is one in the last half."""
    data = text.encode("utf-8")[:nbytes]
    cut = data.rfind(b"\n")
    if cut > nbytes // 2:
        data = data[:cut + 1]
    return data.decode("utf-8", errors="ignore")


def fill_from_files(cat: Category, sources, target: int, seen: set, prose: bool) -> None:
    """Documents from the sources' files until cat has target bytes: each time from the source
    that has given the fewest bytes so far (so one large manual does not make up a small
    share), one piece of a file (files cut by _pieces) at a time."""
    queues = {name: list(items) for name, items in sources if items}
    pending: dict[str, list[str]] = {name: [] for name in queues}   # pieces of an open file
    given = dict.fromkeys(queues, 0)

    def next_piece(name: str) -> tuple[str, bool] | None:
        if pending[name]:
            return pending[name].pop(0), False
        items = queues[name]
        while items:
            item = items.pop(0)
            text = item[1] if isinstance(item, tuple) else \
                _metadata_description(item) if item.name == "METADATA" else _read(item)
            if text is None:
                continue
            digest = hashlib.sha1(text.encode("utf-8")).digest()
            if digest in seen or (prose and _looks_like_code(text)):
                continue
            seen.add(digest)
            pending[name] = _pieces(text)
            return pending[name].pop(0), True
        return None

    live = list(queues)
    while cat.nbytes < target and live:
        name = min(live, key=lambda n: given[n])
        got = next_piece(name)
        if got is None:
            live.remove(name)
            continue
        piece, first = got
        left = target - cat.nbytes
        piece = _cut(piece, left) if len(piece.encode("utf-8")) > left else piece
        if piece:
            before = cat.nbytes
            cat.add(name, piece, files=int(first))
            given[name] += cat.nbytes - before


def repeat_to_fill(cat: Category, target: int) -> None:
    """The category's own distinct text again (a note says so) until it has target bytes."""
    distinct, have = list(cat.docs), cat.nbytes
    if not distinct or have >= target:
        return
    cat.notes.append(f"only {have / 1e6:.2f} MB of distinct {cat.name} found on this machine "
                     f"(share {target / 1e6:.2f} MB): it is repeated to fill the share, so "
                     f"{(target - have) / 1e6:.2f} MB are repeats")
    k = 0
    while cat.nbytes < target:
        doc = distinct[k % len(distinct)]
        left = target - cat.nbytes
        doc = _cut(doc, left) if len(doc.encode("utf-8")) > left else doc
        if not doc:
            break
        cat.add("repeats of the above", doc, files=0)
        k += 1


# ---- multilingual: word lists, sampled ------------------------------------------------------

# Each language: its words, most frequent first (function words, then common nouns and verbs);
# how sentences are put together: the separator between words, a clause mark, the end of a
# sentence and of a question, whether the first word is capitalised, its digits.
LANGUAGES = {
    "zh": dict(sep="", comma="，", end="。", question="？", between="", words="""
的 是 在 了 不 和 有 也 就 都 很 这 我 他 人 们 说 要 会 对 中 上 大 个 为 到 以 来 时 地 与 把
我们 中国 发展 经济 社会 问题 工作 国家 时候 没有 可以 一个 这个 什么 自己 已经 现在 因为 所以
如果 但是 就是 还是 他们 知道 学生 老师 学校 北京 上海 世界 历史 文化 科学 技术 研究 政府 人民
生活 公司 市场 城市 地方 时间 朋友 孩子 今天 明天 非常 重要 需要 认为 开始 进行 通过 提高 发现
表示 关系 方面 情况 目前 主要 电脑 手机 网络 语言 汉字 音乐 电影 新闻 天气 水平 环境 能力 数据
系统 程序 软件 服务器 用户 模型 训练 计算 结果 方法 问题 影响 变化 政策 教育 健康 医院 银行 价格"""),
    "ja": dict(sep="", comma="、", end="。", question="？", between="", words="""
の に は を た が で て と し れ さ ある いる も する から な こと として や れる など ない この
ため その よう また もの という あり まで られ なる へ か だ これ により おり より ず なり です ます
しかし について できる それ ので なお さらに でも たち 特に 及び とき では ながら そして または ところ
日本 東京 大阪 時間 今日 明日 学校 先生 学生 会社 仕事 電話 映画 音楽 言葉 世界 政府 経済 社会
問題 研究 技術 情報 文化 歴史 自分 友達 家族 子供 写真 新聞 天気 電車 駅 食べる 飲む 見る 行く
来る 話す 書く 読む 思う 言う 分かる 使う 作る 考える 新しい 大きい 小さい 多い 少ない 良い
コンピュータ データ システム ソフトウェア インターネット プログラム テスト サーバー モデル ユーザー"""),
    "ko": dict(sep=" ", comma=",", end=".", question="?", between=" ", words="""
우리 나 저 그 이것 그것 것 수 때 사람 한국 서울 부산 시간 오늘 내일 학교 선생님 학생 회사 일
전화 영화 음악 말 세계 정부 경제 사회 문제 연구 기술 정보 문화 역사 자신 친구 가족 아이 사진
신문 날씨 지하철 컴퓨터 데이터 시스템 프로그램 인터넷 서버 모델 사용자 결과 방법 변화 교육 건강""",
               particles="이 가 은 는 을 를 에 에서 의 와 과 도 로 으로 에게 부터 까지 만",
               verbs="""합니다 했습니다 있습니다 없습니다 입니다 됩니다 갑니다 봅니다 먹습니다 좋습니다
한다 했다 있다 없다 이다 된다 간다 본다 말했다 생각한다 알았다 만들었다 사용한다"""),
    "th": dict(sep="", comma=" ", end=" ", question=" ", between="", words="""
ที่ การ ของ และ ใน เป็น มี ไม่ ได้ ให้ จะ ว่า กับ คน นี้ ความ ก็ แต่ ไป มา อยู่ ทำ จาก โดย ผู้ เรา
เขา ฉัน ผม ประเทศ ไทย กรุงเทพ เวลา วันนี้ พรุ่งนี้ โรงเรียน ครู นักเรียน บริษัท งาน โทรศัพท์ ภาพยนตร์
เพลง ภาษา โลก รัฐบาล เศรษฐกิจ สังคม ปัญหา วิจัย เทคโนโลยี ข้อมูล วัฒนธรรม ประวัติศาสตร์ เพื่อน
ครอบครัว เด็ก น้ำ อาหาร กิน ดื่ม ดู พูด เขียน อ่าน คิด รู้ ใช้ สร้าง คอมพิวเตอร์ ระบบ โปรแกรม
อินเทอร์เน็ต มาก แล้ว อีก ต้อง สามารถ เพราะ ถ้า หรือ เมื่อ ทุก ใหม่ ใหญ่ เล็ก ดี สวย ๆ"""),
    "ar": dict(sep=" ", comma="،", end=".", question="؟", between=" ", digits="٠١٢٣٤٥٦٧٨٩",
               words="""
في من على إلى أن عن مع هذا هذه التي الذي كان كانت لا ما هو هي بين كل قد ذلك بعد عند حتى أو ثم
لم لن إن العالم اليوم الناس الحكومة الاقتصاد المجتمع المشكلة البحث التكنولوجيا المعلومات الثقافة
التاريخ المدرسة الطالب المعلم الشركة العمل الهاتف الكتاب اللغة العربية مصر القاهرة الرياض دبي يقول
قال يمكن يجب جديد كبير الأول عام سنة يوم وقت البيت الماء الطعام الحاسوب البرنامج الإنترنت البيانات
والتي وفي ومن الذين عليه فيها منها لها له بها أكثر أيضا حيث خلال"""),
    "fa": dict(sep=" ", comma="،", end=".", question="؟", between=" ", digits="۰۱۲۳۴۵۶۷۸۹",
               words="""
و در به از که این را با است برای آن یک خود تا کرد بر هم نیز شده شد می ما من تو او آنها ایران
تهران زمان انسان سال روز زندگی کار کلمه جا کشور جهان شهر دولت شرکت سیستم برنامه داده زبان فارسی
تاریخ فرهنگ مدرسه معلم دانشجو کتاب خانه آب غذا رایانه اینترنت می‌شود می‌کند نمی‌دانم"""),
    "hi": dict(sep=" ", comma=",", end="।", question="?", between=" ", digits="०१२३४५६७८९",
               words="""
के है में की और को से का एक यह पर हैं भी नहीं तो कि था लिए कर किया गया ने हो जो इस साथ वह रहा
अपने कुछ होता सकता भारत दिल्ली मुंबई सरकार देश लोग समय आज कल विद्यालय शिक्षक छात्र कंपनी काम
फ़ोन फिल्म संगीत भाषा हिंदी दुनिया अर्थव्यवस्था समाज समस्या शोध तकनीक जानकारी संस्कृति इतिहास
दोस्त परिवार बच्चे पानी खाना देखना जाना आना बोलना लिखना पढ़ना सोचना कंप्यूटर डेटा प्रणाली इंटरनेट"""),
    "bn": dict(sep=" ", comma=",", end="।", question="?", between=" ", digits="০১২৩৪৫৬৭৮৯",
               words="""
এবং এই যে করে হয় না তিনি একটি থেকে জন্য সঙ্গে কিন্তু আমি তুমি আমরা তারা ছিল হবে বাংলাদেশ ঢাকা
কলকাতা সময় মানুষ বছর দিন জীবন কাজ ভাষা বাংলা পৃথিবী শহর সরকার ইতিহাস সংস্কৃতি বিদ্যালয় শিক্ষক
ছাত্র বই পানি খাবার কম্পিউটার তথ্য"""),
    "ta": dict(sep=" ", comma=",", end=".", question="?", between=" ", words="""
ஒரு மற்றும் இந்த அந்த என்று அது இது நான் நீ அவர் நாங்கள் அவர்கள் தமிழ் இந்தியா சென்னை நேரம்
மனிதன் ஆண்டு நாள் வாழ்க்கை வேலை மொழி உலகம் நகரம் அரசு வரலாறு கலாச்சாரம் பள்ளி ஆசிரியர் மாணவர்
இருக்கிறது செய்தார் வந்தார் புத்தகம் தண்ணீர் உணவு கணினி தகவல்"""),
    "ru": dict(sep=" ", comma=",", end=".", question="?", between=" ", cased=True, words="""
и в не на я что он с как а то все она так его но да ты к у же вы за бы по только ее мне было вот
от меня еще нет о из ему теперь когда даже ну ли если уже или ни быть был до вас опять вам ведь
там потом себя ничего может они тут где есть надо для мы тебя их чем была сам без тоже себе под
будет тогда кто этот того потому этого какой совсем здесь один почти мой тем чтобы сейчас были
Россия Москва время человек год день жизнь работа слово место дело страна мир город государство
компания система программа данные интернет компьютер язык история культура школа учитель ученик"""),
    "uk": dict(sep=" ", comma=",", end=".", question="?", between=" ", cased=True, words="""
і в на не що з до як у та це він я ти ми вони був була було бути має можна треба дуже також але
або якщо коли тому їх її є ще вже Україна Київ Львів мова час людина рік день життя робота світ
місто держава історія культура школа вчитель учень ґанок їжа європейський"""),
    "sr": dict(sep=" ", comma=",", end=".", question="?", between=" ", cased=True, words="""
и у је да се на за од са не који као што али то су био ће Србија Београд време човек година дан
живот посао реч место земља свет град влада систем програм језик историја култура школа ђак љубав
њега џеп ћирилица"""),
    "el": dict(sep=" ", comma=",", end=".", question=";", between=" ", cased=True, words="""
και το να η ο της σε τα με που των για την του είναι από στο δεν θα στην ένα τον οι μια στα αλλά
όταν πολύ έχει ήταν τους μου σου αυτό αυτή όπως μας κάθε μόνο Ελλάδα Αθήνα χρόνος άνθρωπος χρόνια
ημέρα ζωή δουλειά λέξη τόπος χώρα κόσμος πόλη κυβέρνηση εταιρεία σύστημα πρόγραμμα δεδομένα
διαδίκτυο υπολογιστής γλώσσα ιστορία πολιτισμός σχολείο δάσκαλος μαθητής"""),
    "he": dict(sep=" ", comma=",", end=".", question="?", between=" ", words="""
של את על לא זה הוא היא כי עם גם אני מה כל אבל יש אין היה הייתה או אם רק כמו אחד לי לו שלא אותו
הם הן אנחנו ישראל ירושלים חיפה זמן אדם שנה יום חיים עבודה מילה מקום ארץ עולם עיר ממשלה חברה
מערכת תוכנה נתונים אינטרנט מחשב שפה עברית היסטוריה תרבות בית ספר מורה תלמיד"""),
    "ka": dict(sep=" ", comma=",", end=".", question="?", between=" ", words="""
და არის რომ ეს არ ის მე შენ ჩვენ ისინი იყო საქართველო თბილისი დრო ადამიანი წელი დღე ცხოვრება
სამუშაო სიტყვა ქვეყანა მსოფლიო ქალაქი მთავრობა ისტორია კულტურა სკოლა მასწავლებელი მოსწავლე ენა
ქართული წიგნი წყალი"""),
    "hy": dict(sep=" ", comma=",", end="։", question="։", between=" ", cased=True, words="""
և է որ այդ այս ես դու նա մենք նրանք էր Հայաստան Երևան ժամանակ մարդ տարի օր կյանք աշխատանք բառ
երկիր աշխարհ քաղաք կառավարություն պատմություն մշակույթ դպրոց ուսուցիչ աշակերտ լեզու հայերեն գիրք"""),
    "fr": dict(sep=" ", comma=",", end=".", question=" ?", between=" ", cased=True, words="""
de la le et les des en un du une que est pour qui dans à par plus pas au sur ne se ce il sont avec
ou son été aussi être fait où très après même déjà elle nous vous avoir faire dire pouvoir aller
voir savoir vouloir venir prendre école élève français société économie problème développement île
forêt château garçon ça leçon naïve Noël cœur œuvre là façon réussi théâtre préféré année"""),
    "de": dict(sep=" ", comma=",", end=".", question="?", between=" ", cased=True, words="""
der die und in den von zu das mit sich des auf für ist im dem nicht ein eine als auch es an werden
aus er hat dass sie nach wird bei einer um am sind noch wie einem über einen so zum war haben nur
oder aber vor zur bis mehr durch man sein wurde Straße größer Mädchen Bücher Grüße schön müssen
können Öffentlichkeit Äpfel Übung Wärme weiß heißen Fußball Tschüss Universität Gemüse"""),
    "es": dict(sep=" ", comma=",", end=".", question="?", between=" ", cased=True, words="""
de la que el en y a los se del las un por con no una su para es al lo como más o pero sus le ha
me si sin sobre este ya entre cuando todo esta ser son dos también fue había era muy años hasta
desde está mi porque qué sólo han yo hay vez puede todos así nos ni parte tiene él donde bien tiempo
España México niño señor corazón canción información educación mañana pequeño compañía"""),
    "vi": dict(sep=" ", comma=",", end=".", question="?", between=" ", cased=True, words="""
của và các có được là trong cho người những không với một này đã để theo đến về khi từ năm như
nhiều cũng tại ra Việt Nam Hà Nội thành phố đường nước công ty chính phủ kinh tế xã hội vấn đề
nghiên cứu công nghệ thông tin văn hóa lịch sử trường học giáo viên học sinh bạn bè gia đình trẻ
em ăn uống nói viết đọc nghĩ biết dùng làm máy tính dữ liệu hệ thống chương trình"""),
    "pl": dict(sep=" ", comma=",", end=".", question="?", between=" ", cased=True, words="""
i w nie na się z do to że jest o jak po co tak za ale od są przez dla już był może być jego tylko
tym jej czy bardzo gdzie który która również Polska Warszawa czas człowiek rok dzień życie praca
słowo miejsce kraj świat miasto rząd firma system program dane język historia kultura szkoła
nauczyciel uczeń żółw źródło łódź gęś ćma mąka"""),
    "tr": dict(sep=" ", comma=",", end=".", question="?", between=" ", cased=True, words="""
ve bir bu da de için ile ne ama daha çok gibi olarak kadar sonra ben sen o biz siz onlar var yok
olan olduğu ancak şey her değil Türkiye İstanbul Ankara zaman insan yıl gün hayat iş kelime yer
ülke dünya şehir hükümet şirket sistem program veri dil tarih kültür okul öğretmen öğrenci çocuk
güzel büyük küçük ışık şöyle böyle doğru ağaç"""),
    "cs": dict(sep=" ", comma=",", end=".", question="?", between=" ", cased=True, words="""
a se v na je že s z do o to i k ve jako pro by ale jsem které který jeho po jak tak od jsou za při
už být bylo byl ještě jen když nebo může má také Česko Praha čas člověk rok den život práce slovo
místo země svět město vláda firma systém program data jazyk historie kultura škola učitel žák řeka
příliš žluťoučký kůň úpěl ďábelské ódy"""),
}
SCRIPT = {"zh": "Han", "ja": "Han + kana", "ko": "Hangul", "th": "Thai", "ar": "Arabic",
          "fa": "Arabic", "hi": "Devanagari", "bn": "Bengali", "ta": "Tamil", "ru": "Cyrillic",
          "uk": "Cyrillic", "sr": "Cyrillic", "el": "Greek", "he": "Hebrew", "ka": "Georgian",
          "hy": "Armenian", "fr": "Latin", "de": "Latin", "es": "Latin", "vi": "Latin",
          "pl": "Latin", "tr": "Latin", "cs": "Latin"}


def _zipf(words: list[str]) -> list[float]:
    """Cumulative weights 1 / (rank + 5): the first words are drawn the most (the offset
    because a list of ~100 words stands for a vocabulary of thousands: the top word is drawn
    ~7% of the time, as in real text, not 1/H(100) = 19%)."""
    total, out = 0.0, []
    for rank in range(len(words)):
        total += 1.0 / (rank + 5)
        out.append(total)
    return out


class Sentences:
    """Sentences of one language from its word list (see LANGUAGES)."""

    def __init__(self, lang: str, rng: random.Random):
        spec = LANGUAGES[lang]
        self.lang, self.rng, self.spec = lang, rng, spec
        self.words = spec["words"].split()
        self.weights = _zipf(self.words)
        self.particles = spec.get("particles", "").split()
        self.verbs = spec.get("verbs", "").split()
        self.digits = spec.get("digits", "0123456789")

    def word(self) -> str:
        rng = self.rng
        if rng.random() < 0.03:   # a number: a year, a count, a decimal
            n = str(rng.choice([rng.randint(1900, 2030), rng.randint(1, 999),
                                rng.randint(1000, 99999)]))
            if rng.random() < 0.5 and self.digits != "0123456789":
                n = n.translate(str.maketrans("0123456789", self.digits))
            return n
        word = rng.choices(self.words, cum_weights=self.weights)[0]
        if self.particles and rng.random() < 0.7:   # Korean: a noun and its particle
            word += rng.choice(self.particles)
        return word

    def sentence(self) -> str:
        rng, spec = self.rng, self.spec
        n = rng.randint(6, 24) if spec["sep"] == "" else rng.randint(4, 16)
        words = [self.word() for _ in range(n)]
        if self.verbs:
            words.append(rng.choice(self.verbs))
        for k in range(len(words) - 1):
            if rng.random() < 0.08:
                words[k] += spec["comma"]
        if spec.get("cased"):
            words[0] = words[0][:1].upper() + words[0][1:]
        end = spec["question"] if rng.random() < 0.1 else spec["end"]
        return spec["sep"].join(words) + end

    def document(self) -> str:
        rng, between = self.rng, self.spec["between"]
        paragraphs = [between.join(self.sentence() for _ in range(rng.randint(2, 8))).strip()
                      for _ in range(rng.randint(1, 12))]
        return "\n\n".join(paragraphs) + "\n"


def fill_generated_languages(cat: Category, target: int, rng: random.Random) -> None:
    makers = {lang: Sentences(lang, rng) for lang in LANGUAGES}
    langs = sorted(makers)
    while cat.nbytes < target:
        lang = rng.choice(langs)
        doc = makers[lang].document()
        left = target - cat.nbytes
        doc = _cut(doc, left) if len(doc.encode("utf-8")) > left else doc
        if not doc:
            break
        cat.add(f"generated: {len(langs)} languages, {len(set(SCRIPT.values()))} scripts "
                "(embedded word lists)", doc, files=0)


def multilingual_files() -> list[tuple[str, list]]:
    stdlib = _stdlib()
    cjk = sorted(set(stdlib.glob("test/cjkencodings/*utf-8*")) |
                 set(stdlib.glob("test/cjkencodings/*utf8*")))
    seeds = []
    for root in dict.fromkeys([REPO / "shared" / "seeds", REPO.parent / "shared" / "seeds"]):
        if root.is_dir():
            seeds += sorted(root.glob("*.txt"))
    return [("stdlib test/cjkencodings (real CJK text)", cjk),
            ("shared/seeds (Turkish prose)", seeds)]


# ---- adversarial ----------------------------------------------------------------------------

EMOJI = ["👍🏽", "👩‍💻", "🇹🇷", "🏳️‍🌈", "❤️", "😀", "👨‍👩‍👧‍👦", "1️⃣", "🧑🏿‍🚀", "🇯🇵"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u3000", "\xa0", "\n\n   ", "\u2009", "\v", "\f"]
LONG_SHARE = 0.05   # of the adversarial share: the long single pieces, before the mix


def fill_adversarial(cat: Category, target: int, rng: random.Random) -> None:
    letters = "abcdefghijklmnopqrstuvwxyz"
    long_pieces = [("x", 262_144), ("日本語中文漢字", 252_000), (" ", 65_536), ("7", 65_536),
                   ("=", 65_536), (None, 65_536)]
    scale = min(1.0, LONG_SHARE * target / sum(n for _, n in long_pieces))
    for unit, size in long_pieces:   # one pre-token each
        size = max(1, int(size * scale))
        if unit is None:
            doc = "".join(rng.choice(letters) for _ in range(size))
        elif unit == " ":
            doc = "a" + " " * size + "b"
        else:   # size bytes of the unit repeated
            chars = max(1, size * len(unit) // len(unit.encode()))
            doc = (unit * (chars // len(unit) + 1))[:chars]
        cat.add("long single pieces", doc, files=0)

    def add(source: str, doc: str) -> bool:
        left = target - cat.nbytes
        if left <= 0:
            return False
        doc = _cut(doc, left) if len(doc.encode("utf-8")) > left else doc
        if doc:
            cat.add(source, doc, files=0)
        return bool(doc)

    while cat.nbytes < target:
        kind = rng.random()
        if kind < 0.45:
            cps = [rng.randint(0, 0x10FFFF) for _ in range(rng.randint(10, 3000))]
            ok = add("random code points, all planes",
                     "".join(chr(c) for c in cps if not 0xD800 <= c <= 0xDFFF))
        elif kind < 0.6:
            ok = add("emoji sequences", " ".join(rng.choice(EMOJI) * rng.randint(1, 5)
                                                 for _ in range(rng.randint(10, 500))))
        elif kind < 0.75:
            ok = add("mixed whitespace runs", "".join(
                rng.choice(SPACES) * rng.randint(1, 6) + rng.choice(["a", "1", ".", "", "é"])
                for _ in range(rng.randint(10, 3000))))
        elif kind < 0.85:
            ok = add("digit runs", "".join(
                str(rng.randint(0, 10 ** rng.randint(1, 40))) + rng.choice([" ", ".", ",", ""])
                for _ in range(rng.randint(10, 2000))))
        elif kind < 0.92:
            ok = add('"=" and other punctuation runs', "\n".join(
                rng.choice("=-_*#~.") * rng.randint(1, 400) for _ in range(rng.randint(5, 200))))
        else:
            ok = add("random letters", " ".join(
                "".join(rng.choice(letters + letters.upper()) for _ in range(rng.randint(1, 300)))
                for _ in range(rng.randint(5, 200))))
        if not ok:
            break


# ---- the corpus -----------------------------------------------------------------------------

def parse_mix(text: str) -> dict[str, float]:
    """'prose=0.25,code=0.75' -> shares by category (the named ones; they are normalised)."""
    mix = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in CATEGORIES:
            raise ValueError(f"--mix: unknown category {name!r}; the categories are "
                             f"{', '.join(CATEGORIES)}")
        try:
            mix[name] = float(value)
        except ValueError:
            raise ValueError(f"--mix: {part!r} is not category=share (e.g. prose=0.25)") from None
    total = sum(mix.values())
    if total <= 0:
        raise ValueError(f"--mix {text!r}: the shares add up to {total}; give at least one > 0")
    return {k: v / total for k, v in mix.items()}


def build_corpus(megabytes: float, mix: dict[str, float] | None = None,
                 seed: int = 2026) -> Corpus:
    mix = mix or {c: 1 / len(CATEGORIES) for c in CATEGORIES}
    total = int(megabytes * (1 << 20))
    cats = {name: Category(name) for name in CATEGORIES if mix.get(name, 0) > 0}
    seen: set = set()
    for name, cat in cats.items():
        target = int(total * mix[name])
        rng = random.Random(f"{seed}:{name}")
        if name == "prose":
            fill_from_files(cat, prose_sources(), target, seen, prose=True)
            if not cat.docs:
                cat.notes.append("no prose found on this machine: the category is empty")
            repeat_to_fill(cat, target)
        elif name == "multilingual":
            fill_from_files(cat, multilingual_files(), target // 4, seen, prose=False)
            fill_generated_languages(cat, target, rng)
        elif name == "code":
            fill_from_files(cat, code_sources(), target, seen, prose=False)
            if cat.nbytes < target:
                repeat_to_fill(cat, target)
        else:
            fill_adversarial(cat, target, rng)
    order = [(name, i) for name, cat in cats.items() for i in range(len(cat.docs))]
    random.Random(seed).shuffle(order)
    return Corpus(cats, order, seed)


if __name__ == "__main__":   # python bench/tokenize_corpus.py [MB]: the composition
    import json
    corpus = build_corpus(float(sys.argv[1]) if len(sys.argv) > 1 else 64)
    print(json.dumps(corpus.composition, indent=1, ensure_ascii=False))
